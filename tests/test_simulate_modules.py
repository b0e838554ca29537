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
    assert a["findings"] == b["findings"]
    names = {e["name"] for e in json.loads(_read(tmp_path / "b" / "rank0.trace.json.gz"))["traceEvents"]}
    assert {"nn.Module: Block_0", "overlapcheck.grad: layers.0 (Block)"} <= names


def _read(path: Path) -> str:
    import gzip

    return gzip.decompress(path.read_bytes()).decode()
