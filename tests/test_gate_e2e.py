"""The gate on simulated ZeRO-3 jobs: seed-to-seed noise passes the defaults, a real regression fails them."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from overlapcheck.cli import main
from overlapcheck.simulate import generate


def simulate_and_analyze(tmp_path, scenario: str, seed: int) -> str:
    """The JSON report of a simulated job. Simulated without the truth's costs (`costs=False`: the counterfactual
    runs, 3/4 of the time): the gate reads only the report of the traces, which are the same with or without
    them; `overlapcheck simulate` itself is tested in test_simulate.py."""
    out = tmp_path / f"{scenario}-{seed}"
    generate(scenario, out, costs=False, seed=seed, steps=2)
    report = tmp_path / f"{scenario}-{seed}.json"
    result = CliRunner().invoke(main, ["analyze", str(out), "--format", "json", "-o", str(report)])
    assert result.exit_code == 0, result.output
    return str(report)


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> str:
    return simulate_and_analyze(tmp_path_factory.mktemp("sim"), "healthy", 1)


def gate(*args: str):
    return CliRunner().invoke(main, ["gate", *args], env={"GITHUB_STEP_SUMMARY": ""})


def test_run_to_run_noise_passes_default_tolerances(baseline, tmp_path):
    again = simulate_and_analyze(tmp_path, "healthy", 2)  # same job, other jitter and clock offsets
    result = gate(again, "--baseline", baseline, "--min-overlap", "all=0.7")
    assert result.exit_code == 0, result.output


def test_config_regression_fails(baseline, tmp_path):
    worse = simulate_and_analyze(tmp_path, "healthy+bucket-too-large", 2)
    junit = tmp_path / "gate.xml"
    result = gate(worse, "--baseline", baseline, "--junit", str(junit))
    assert result.exit_code == 1, result.output
    # every kind of the baseline is checked: inputs, world size + (all, reduce-scatter, all-gather, all-reduce) x 2;
    # the deferred reduce-scatter fails both of its own checks and both of `all`, all-gather and all-reduce pass
    assert "gate: FAIL (4 of 10 checks failed)" in result.output
    xml = junit.read_text()
    assert xml.count("<failure") == 4
    for check in ("exposed-regression.all", "overlap-drop.all", "exposed-regression.reduce_scatter"):
        assert f'name="{check}">\n      <failure' in xml, check
    assert 'name="overlap-drop.reduce_scatter">\n      <failure' in xml
