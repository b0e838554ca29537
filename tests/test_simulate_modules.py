"""The simulator's module frames (SimConfig.module_frames): the per-module attribution of the analysis matches the
simulator's own record of which modules each collective serves, at 2x4 and 4x8; and the frames take no host time,
so every other number of the set is the one without them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from overlapcheck.pipeline import analyze
from overlapcheck.simulate import generate

CASES = [("healthy", 2, 4), ("no-prefetch", 2, 4), ("bucket-too-large", 4, 8)]


def _report_rows(report) -> dict[str, dict]:
    """The report's MODULES rows as truth's keys (`module|kind|phase`), summed over sources."""
    out: dict[str, dict] = {}
    for r in report.modules.rows:
        key = f"{r.module or ''}|{r.kind}|{r.phase or ''}"
        row = out.setdefault(key, {"count": 0, "time_us": 0.0, "hidden_us": 0.0, "exposed_us": 0.0})
        row["count"] += r.count
        for field in ("time_us", "hidden_us", "exposed_us"):
            row[field] += getattr(r, field)
    return out


def _truth_rows(truth: dict) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for rows in truth["modules"].values():
        for key, t in rows.items():
            row = out.setdefault(key, {"count": 0, "time_us": 0.0, "hidden_us": 0.0, "exposed_us": 0.0})
            for field in row:
                row[field] += t[field]
    return out


@pytest.mark.parametrize(("scenario", "nodes", "gpus"), CASES, ids=[f"{c[0]}-{c[1]}x{c[2]}" for c in CASES])
def test_attribution_matches_the_simulators_truth(tmp_path: Path, scenario: str, nodes: int, gpus: int) -> None:
    truth = generate(scenario, tmp_path, costs=False, nodes=nodes, gpus_per_node=gpus, steps=2, module_frames=True)
    report = analyze(tmp_path, diagnose=False)
    assert report.modules is not None and report.modules.notes == []
    got, want = _report_rows(report), _truth_rows(truth)
    assert set(got) == set(want)
    for key, t in want.items():
        g = got[key]
        assert g["count"] == t["count"], key
        for field in ("time_us", "hidden_us", "exposed_us"):  # truth rounds each rank's sums to 1e-4 µs
            assert g[field] == pytest.approx(t[field], abs=1e-3 * len(truth["modules"])), (key, field)
    # every all-gather and every gradient bucket serves a module; only the step's norm all-reduce serves none
    assert {key.split("|")[1] for key in want if key.startswith("|")} <= {"all_reduce"}
    assert any(k.startswith("layers.0|reduce_scatter|") for k in want) and "embed|all_gather|forward" in want


def test_module_frames_take_no_host_time(tmp_path: Path) -> None:
    plain = generate("healthy", tmp_path / "a", costs=False, nodes=2, gpus_per_node=1, steps=2)
    framed = generate("healthy", tmp_path / "b", costs=False, nodes=2, gpus_per_node=1, steps=2, module_frames=True)
    assert framed["ranks"] == plain["ranks"] and framed["step_time_us"] == plain["step_time_us"]
    assert "modules" not in plain and framed["config"]["module_frames"] is True
    a = analyze(tmp_path / "a").to_dict()
    b = analyze(tmp_path / "b").to_dict()
    assert a["ranks"] == [{**r, "source": r["source"].replace("/b/", "/a/")} for r in b["ranks"]]
    # the same findings; with module frames they may name the modules their windows hold (evidence.modules)
    unnamed = [{**f, "evidence": {k: v for k, v in f["evidence"].items() if k != "modules"}} for f in b["findings"]]
    assert a["findings"] == unnamed
    names = {e["name"] for e in json.loads(_read(tmp_path / "b" / "rank0.trace.json.gz"))["traceEvents"]}
    assert {"nn.Module: Block_0", "overlapcheck.grad: layers.0 (Block)"} <= names


def _read(path: Path) -> str:
    import gzip

    return gzip.decompress(path.read_bytes()).decode()


def test_findings_name_the_modules_whose_exposed_collectives_they_explain(tmp_path: Path) -> None:
    """no-prefetch at 2x4: the first modules' gathers after the optimizer step have nothing to hide behind; the
    all-gather findings name them, with parts of the finding's cost that add up to at most the cost."""
    generate("no-prefetch", tmp_path, costs=False, nodes=2, gpus_per_node=4, steps=2, module_frames=True)
    report = analyze(tmp_path)
    gathers = [f for f in report.findings if f.rule.startswith("allgather-") and f.evidence.get("modules")]
    assert gathers, [f.rule for f in report.findings]
    for f in gathers:
        named = f.evidence["modules"]
        assert named[0]["module"] in ("embed", "layers.0")
        assert all(m["module"] == "embed" or m["module"].startswith("layers.") for m in named)
        assert [m["cost_us"] for m in named] == sorted((m["cost_us"] for m in named), reverse=True)
        assert sum(m["share"] for m in named) <= 1.0 + 1e-6
    from overlapcheck.report import renderer

    assert "modules: embed" in renderer("text").render(report)


def test_module_index_shares_a_findings_cost_by_exposed_time_in_its_windows() -> None:
    import numpy as np

    from overlapcheck.analysis import intervals as iv
    from overlapcheck.analysis.modules import ModuleIndex

    index = ModuleIndex(
        start=np.array([0.0, 100.0, 300.0]),
        end=np.array([50.0, 200.0, 400.0]),
        served=[[("a", None)], [("b", None), ("c", None)], [("d", None)]],
        compute=iv.union(np.array([150.0]), np.array([200.0])),
    )
    # windows over the first two: a exposed 50, the bucket exposed 50 (split b 25, c 25); d outside the windows
    named = index.named_in(iv.union(np.array([0.0]), np.array([250.0])), cost_us=10.0)
    assert named == [
        {"module": "a", "cost_us": 5.0, "share": 0.5},
        {"module": "b", "cost_us": 2.5, "share": 0.25},
        {"module": "c", "cost_us": 2.5, "share": 0.25},
    ]
    assert index.named_in(iv.union(np.array([150.0]), np.array([200.0])), cost_us=10.0) == []  # all hidden
