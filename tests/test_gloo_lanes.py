"""gloo (CPU-only) runs: communication lanes are the threads `gloo:*` annotations run on, whatever the profiler
named them (docs/metrics.md, CPU-only (gloo) traces). Hand-built traces with every naming seen on real runs,
and a real two-rank DeepSpeed ZeRO-3 capture whose rank 0 has a gloo worker thread named `python3`."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from builders import step, write_trace

from overlapcheck.analysis.activities import gloo_threads
from overlapcheck.model import Split
from overlapcheck.pipeline import analyze, analyze_trace
from overlapcheck.trace.reader import load_trace

GLOO_2RANK = Path(__file__).parent / "data" / "gloo-2rank"
PID = 100


def thread_name(tid: int, name: str) -> dict[str, Any]:
    return {"ph": "M", "name": "thread_name", "pid": PID, "tid": tid, "args": {"name": f"thread {tid} ({name})"}}


def op(name: str, ts: float, dur: float, tid: int, cat: str = "cpu_op") -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur}


def gloo_step(main: str, worker_a: str, worker_b: str) -> list[dict[str, Any]]:
    """One step on three threads: the main thread (1) issues an all-reduce and an all-gather and computes
    [40, 60); gloo runs the all-reduce [12, 30) on thread 2 and the all-gather [32, 50) on thread 3."""
    return [
        thread_name(1, main),
        thread_name(2, worker_a),
        thread_name(3, worker_b),
        step(1, 0, 100, tid=1) | {"pid": PID},
        op("c10d::allreduce_", 10, 2, 1),
        op("c10d::_allgather_base_", 30, 2, 1),
        op("aten::mm", 40, 20, 1),
        op("gloo:all_reduce", 12, 18, 2, "user_annotation"),
        op("gloo:all_gather", 32, 18, 3, "user_annotation"),
    ]


NAMINGS = [
    ("python3", "pt_gloo_runloop", "pt_gloo_runloop"),  # as torch names them most of the time
    ("python3", "python3", "pt_gloo_runloop"),  # one worker named after the process (about half the ranks)
    ("python3", "pt_gloo_runloop", "python3"),
    ("python3", "python3", "python3"),
    ("pt_main_thread", "pt_main_thread", "pt_main_thread"),  # HTA's cpu_only trace
]


@pytest.mark.parametrize("names", NAMINGS, ids=["-".join(n) for n in NAMINGS])
def test_gloo_lanes_are_found_by_what_runs_on_them(tmp_path, names):
    path = write_trace(tmp_path, "rank0.json.gz", gloo_step(*names))
    r = analyze_trace(str(path)).metrics
    assert r.lanes == "cpu"
    c = r.collectives
    # the all-reduce [12, 30) runs beside no compute; the all-gather [32, 50) beside aten::mm [40, 60) from 40
    assert c["all_reduce"] == Split(count=1, time_us=18.0, overlapped_us=0.0, exposed_us=18.0, overlap=0.0)
    assert c["all_gather"] == Split(count=1, time_us=18.0, overlapped_us=10.0, exposed_us=8.0, overlap=10 / 18)
    assert c["all"].count == 2 and c["all"].exposed_us == 26
    assert r.compute_us == 20
    assert {s.stream for s in r.streams} == {-1, *(t for t in gloo_threads(load_trace(str(path))))}
    assert [s.collectives["all"].count for s in r.steps] == [2]
    assert any("found by what runs on them" in n for n in r.notes)


def test_a_thread_that_issues_collectives_is_never_a_lane(tmp_path):
    # the main thread carries a gloo:* annotation too (as an async work's title could): it issues the c10d ops,
    # so it stays the compute side, and its annotation is not communication
    events = [*gloo_step("python3", "pt_gloo_runloop", "python3"), op("gloo:barrier", 70, 5, 1, "user_annotation")]
    model = load_trace(str(write_trace(tmp_path, "rank0.json.gz", events)))
    lanes = gloo_threads(model)
    assert sorted(model.threads[t][1] for t in lanes) == [2, 3]
    r = analyze_trace(str(tmp_path / "rank0.json.gz")).metrics
    assert r.collectives["all"].count == 2


def test_no_gloo_annotations_no_lanes(tmp_path):
    events = [thread_name(2, "pt_gloo_runloop"), op("aten::mm", 0, 10, 2), step(1, 0, 20, tid=1) | {"pid": PID}]
    model = load_trace(str(write_trace(tmp_path, "rank0.json.gz", events)))
    assert gloo_threads(model) == set()


# ---- a real capture: rank 0's gloo worker thread 26426 is named python3 ------------------------------------------


def _raw(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)["traceEvents"]


def _gloo_by_thread_name(events: list[dict[str, Any]]) -> Counter[str]:
    names = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
    }
    return Counter(
        names.get((e["pid"], e["tid"]), "")
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("gloo:")
    )


def test_the_capture_has_both_thread_namings():
    """What the set is (tests/data/gloo-2rank/README.md): rank 0 has one gloo worker named python3."""
    rank0 = _gloo_by_thread_name(_raw(GLOO_2RANK / "rank0.pt.trace.json.gz"))
    rank1 = _gloo_by_thread_name(_raw(GLOO_2RANK / "rank1.pt.trace.json.gz"))
    assert rank0 == {"thread 26426 (python3)": 20, "thread 26428 (pt_gloo_runloop)": 18}
    assert rank1 == {"thread 26427 (pt_gloo_runloop)": 19, "thread 26429 (pt_gloo_runloop)": 19}


def test_real_gloo_capture_counts_every_collective_on_both_ranks():
    report = analyze(GLOO_2RANK, jobs=1)
    assert report.errors == [] and [r.rank for r in report.ranks] == [0, 1]
    for r in report.ranks:
        events = _raw(GLOO_2RANK / f"rank{r.rank}.pt.trace.json.gz")
        issued = Counter(e["name"] for e in events if e.get("cat") == "cpu_op" and e["name"].startswith("c10d::"))
        assert issued == {"c10d::_reduce_scatter_base_": 22, "c10d::_allgather_base_": 14, "c10d::allreduce_": 2}
        counts = {k: v.count for k, v in r.collectives.items() if v.count}
        assert counts == {"all": 38, "reduce_scatter": 22, "all_gather": 14, "all_reduce": 2}, r.rank
        assert r.lanes == "cpu" and r.backend == "gloo" and r.world_size == 2
        assert [(s.step, s.collectives["all"].count) for s in r.steps] == [(3, 19), (4, 19)]
        assert {s.stream for s in r.streams if s.stream >= 0} == gloo_threads(
            load_trace(str(GLOO_2RANK / f"rank{r.rank}.pt.trace.json.gz"))
        )
        assert r.collectives["all"].overlap is not None and r.exposed_share is not None
    # the two ranks ran the same collectives: the same numbers per step
    a, b = ([s.collectives["all"].count for s in r.steps] for r in report.ranks)
    assert a == b
