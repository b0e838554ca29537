"""Diagnosis against the simulator's ground truth (sample_traces/*/truth.json): each planted cause is found with
the fix the truth names, ranked first with a cost within 10 % of the counterfactual where the cost model reaches
that, and a healthy job gets no warning."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from overlapcheck.analysis.pipeline import analyze_paths

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
TOLERANCE = 0.10
LISTED_SHARE = 0.001  # a cause below 0.1 % of the step has no effect in the simulated job: nothing to find
RANKED_SHARE = 0.01  # below 1 % of the step, a cause's cost is within the noise of inherent idle time


def presets() -> list[str]:
    return sorted(p.name for p in SAMPLES.iterdir() if (p / "truth.json").is_file()) if SAMPLES.is_dir() else []


@cache
def diagnosis(preset: str) -> tuple[dict[str, Any], dict[str, Any]]:
    truth = json.loads((SAMPLES / preset / "truth.json").read_text())
    return truth, analyze_paths([str(SAMPLES / preset)], jobs=2)


def causes(preset: str, share: float) -> list[dict[str, Any]]:
    truth = json.loads((SAMPLES / preset / "truth.json").read_text())
    return [c for c in truth["causes"] if c["cost_us"] >= share * truth["step_time_us"]]


def cases(kind: str) -> list[Any]:
    """(preset, rule) pairs, with the known gaps of the cost model marked (measured error in the reason)."""
    known = {
        ("same-communicator", "same-communicator"): "1 GPU per node: truth suggests zero_hpz_partition_size 1 "
        "(a no-op) and the cost is +67 %",
    }
    out = []
    for preset in presets():
        for cause in causes(preset, RANKED_SHARE if kind == "cost" else LISTED_SHARE):
            key = (preset, cause["rule"])
            gap = known.get(key) if kind == "cost" or key == ("same-communicator", "same-communicator") else None
            marks = [pytest.mark.xfail(reason=gap, strict=False)] if gap else []
            out.append(pytest.param(preset, cause["rule"], id=f"{preset}:{cause['rule']}", marks=marks))
    return out


@pytest.mark.parametrize(("preset", "rule"), cases("fix"))
def test_planted_cause_is_listed_with_the_truth_fix(preset: str, rule: str) -> None:
    truth, report = diagnosis(preset)
    planted = next(c for c in truth["causes"] if c["rule"] == rule)
    found = [f for f in report["findings"] if f["rule"] == rule]
    assert found, f"{rule} not found; findings: {[f['rule'] for f in report['findings']]}"
    assert found[0]["fix"] == planted["fix"]
    assert set(planted["ranks"]) <= set(found[0]["ranks"])


@pytest.mark.parametrize(("preset", "rule"), cases("cost"))
def test_planted_cause_is_top_with_the_truth_cost(preset: str, rule: str) -> None:
    truth, report = diagnosis(preset)
    planted = next(c for c in truth["causes"] if c["rule"] == rule)
    top_planted = max(causes(preset, RANKED_SHARE), key=lambda c: c["cost_us"])["rule"]
    ranked = [f["rule"] for f in report["findings"]]
    if rule == top_planted:
        assert ranked[0] == rule
    found = next(f for f in report["findings"] if f["rule"] == rule)
    assert found["cost_us"] == pytest.approx(planted["cost_us"], rel=TOLERANCE)
    assert found["severity"] in ("critical", "warning")


@pytest.mark.parametrize("preset", [p for p in presets() if not json.loads(
    (SAMPLES / p / "truth.json").read_text())["causes"]])  # fmt: skip
def test_healthy_job_has_no_warning(preset: str) -> None:
    _, report = diagnosis(preset)
    assert [f["rule"] for f in report["findings"] if f["severity"] != "info"] == []


def test_explained_share_is_reported_for_a_planted_cause() -> None:
    if "seed-5201" not in presets():
        pytest.skip("no seed-5201 sample")
    _, report = diagnosis("seed-5201")
    assert 0.5 <= report["findings_explain_share"] <= 1.0
