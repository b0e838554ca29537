"""Diagnosis on the real traces in ../shared/traces, checked against what the raw events show."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from overlapcheck.diagnose.registry import BY_ID
from overlapcheck.model import Finding
from overlapcheck.pipeline import analyze

FINDING_KEYS = {"rule", "severity", "title", "why", "cost_us", "ranks", "steps", "evidence", "fix"}


def raw_events(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path, "rt") as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def findings(path: Path) -> list[Finding]:
    report = analyze(path, jobs=1)
    out = report.findings
    ranked = [(BY_ID[f.rule].limit, -f.cost_us) for f in out]
    assert ranked == sorted(ranked)  # by cost, the hardware's limits after the causes
    for f, doc in zip(out, report.to_dict()["findings"], strict=True):
        assert set(doc) - {"paces"} == FINDING_KEYS, f.rule  # `paces` only where true (a straggler)
        assert f.severity in ("critical", "warning", "info") and f.cost_us >= 0
    return out


def sync_counts(found: list[Finding]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for f in found:
        if f.rule == "host-sync":
            for call in f.evidence["calls"]:
                counts[call] += f.evidence["count"]
    return counts


def test_benchmark_syncs_are_all_found_with_their_call_sites(shared_traces: Path) -> None:
    path = next((shared_traces / "edge-cases").glob("benchmark_result_*.json.gz"))
    raw = Counter(e["name"] for e in raw_events(path) if e.get("cat") == "cuda_runtime")
    found = findings(path)
    counts = sync_counts(found)
    assert counts["cudaStreamSynchronize"] == raw["cudaStreamSynchronize"] == 16
    # its 5 cudaDeviceSynchronize calls return without waiting for anything (no GPU work ends inside any)
    assert raw["cudaDeviceSynchronize"] == 5 and counts["cudaDeviceSynchronize"] == 0
    copy_sync = next(f for f in found if f.evidence["calls"] == ["cudaStreamSynchronize"])
    assert copy_sync.evidence["call_site"] == "aten::copy_ < aten::_to_copy < aten::to"  # .to(device) copies
    # the pageable host-to-device copies that block the host in cudaMemcpyAsync are reported too
    assert counts["cudaMemcpyAsync"] > 0
    # one GPU, no collectives: besides syncs, only the default stream waiting for the side streams' kernels
    assert {f.rule for f in found} == {"host-sync", "cross-stream-wait"}
    waits = {
        e["args"]["wait_on_stream"]
        for e in raw_events(path)
        if e.get("name") == "Stream Wait Event" and e["args"]["stream"] == 7
    }
    wait = next(f for f in found if f.rule == "cross-stream-wait")
    assert wait.evidence["waited_for"] == "non-communication work" and wait.evidence["compute_stream"] == 7
    assert set(wait.evidence["waited_on_streams"]) <= waits
    raw_waits = [e for e in raw_events(path) if e.get("name") == "Stream Wait Event" and e["args"]["stream"] == 7]
    assert wait.evidence["stream_wait_events_per_step"] == len(raw_waits)  # no ProfilerStep: one step


def test_event_sync_trace_counts_only_the_blocking_sync(shared_traces: Path) -> None:
    path = shared_traces / "edge-cases" / "event_sync_trace.json.gz"
    events = raw_events(path)
    queries = {e["args"]["correlation"] for e in events if e.get("name") == "cudaEventQuery"}
    event_syncs = [e for e in events if e.get("cat") == "cuda_sync" and e["name"] == "Event Sync"]
    assert event_syncs and all(e["args"]["correlation"] in queries for e in event_syncs)  # allocator queries
    found = findings(path)
    # its one cudaDeviceSynchronize is the profiler's stop: the last call, no enclosing op, nothing issued after
    assert sync_counts(found) == Counter()


def nccl_time(path: Path) -> float:
    return sum(e["dur"] for e in raw_events(path) if e.get("cat") == "kernel" and "nccl" in e["name"].lower())


def test_dlrm_straggler_is_the_rank_that_others_wait_for(shared_traces: Path) -> None:
    folder = shared_traces / "dlrm-8rank-v100"
    per_worker = {int(p.name[len("worker")]): nccl_time(p) for p in folder.glob("worker*.json.gz")}
    expected = min(per_worker, key=per_worker.get)  # shortest NCCL kernels: it never waits for the others
    straggler = [f for f in findings(folder) if f.rule == "straggler"]
    assert len(straggler) == 1 and straggler[0].ranks == [expected] == [7]
    ev = straggler[0].evidence
    assert ev["own_wait_us_per_step"] < ev["others_wait_us_per_step"]["median"]


def test_subsampled_pair_has_no_straggler(shared_traces: Path) -> None:
    # both ranks of the sub-sampled 128-rank job wait about as long as each other
    assert not [f for f in findings(shared_traces / "sampled-2rank") if f.rule == "straggler"]


def test_ddp_event_syncs_are_attributed_to_the_forward(shared_traces: Path) -> None:
    path = shared_traces / "nccl-single-rank" / "nccl_data.json.gz"
    raw = Counter(e["name"] for e in raw_events(path) if e.get("cat") == "cuda_runtime")
    found = findings(path)
    # DDP's 24 cudaEventSynchronize calls (8 at the start of each forward) return in 2-9 µs without waiting for
    # any GPU work (none ends inside them; the first step's come before any GPU activity of the trace)
    assert raw["cudaEventSynchronize"] == 24 and sync_counts(found)["cudaEventSynchronize"] == 0


def test_python_stack_names_the_innermost_user_frame(shared_traces: Path) -> None:
    path = shared_traces / "edge-cases" / "gaunernst_bert-small-uncased__1016001.json.gz"
    events = raw_events(path)
    sync = next(e for e in events if e.get("name") == "cudaStreamSynchronize")
    mid = sync["ts"] + sync["dur"] / 2
    enclosing = [
        e
        for e in events
        if e.get("cat") == "python_function"
        and e["tid"] == sync["tid"]
        and e["ts"] <= mid < e["ts"] + e["dur"]
        and ".py(" in e["name"]
        and not e["name"].startswith(("torch/", "transformers/"))
    ]
    innermost = max(enclosing, key=lambda e: e["ts"])["name"]
    found = [f for f in findings(path) if f.rule == "host-sync" and f.evidence["calls"] == ["cudaStreamSynchronize"]]
    assert found[0].evidence["call_site"] == innermost


@pytest.mark.parametrize(
    "name",
    [
        "cpu-zero3-gloo",
        "edge-cases/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
        "edge-cases/resnet50-torch1.8-worker0.pt.trace.json.gz",
    ],
)
def test_traces_without_collective_kernels_get_no_overlap_findings(shared_traces: Path, name: str) -> None:
    rules = {f.rule for f in findings(shared_traces / name)}
    assert rules <= {"host-sync"}
