"""Every finding on the real traces in ../shared/traces, checked against the raw events: what its evidence cites
is in the trace (the calls, their call sites, the collectives, the ranks), its numbers add up, and what it
charges is no more than the exposed time the trace shows."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from builders import shared_traces_dir

from overlapcheck.model import Finding, Report
from overlapcheck.pipeline import analyze

SETS = [
    "dlrm-8rank-v100",
    "sampled-2rank",
    "nccl-single-rank/nccl_data.json.gz",
    "nccl-single-rank/control.json.gz",
    "cpu-zero3-gloo",
    "edge-cases",
]
SYNC_RULES = {
    "host-sync",
    "comms-logger-sync",
    "throughput-timer-sync",
    "offload-blocking-copy",
    "reduce-event-throttle",
    "fetch-throttle",
    "epilogue-sync",
}


def files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.endswith(".json.gz")) if path.is_dir() else [path]


def raw(path: Path) -> Iterator[dict[str, Any]]:
    for p in files(path):
        with gzip.open(p, "rt") as f:
            doc = json.load(f)
        yield from doc["traceEvents"] if isinstance(doc, dict) else doc


@cache
def names(path: Path) -> frozenset[str]:
    """Every event name in the trace(s)."""
    return frozenset(str(e.get("name", "")) for e in raw(path))


@cache
def diagnosed(path: Path) -> Report:
    return analyze(path, jobs=2)


def cases() -> list[Any]:
    root = shared_traces_dir()
    if root is None:
        return [pytest.param(None, marks=pytest.mark.skip(reason="no ../shared/traces"))]
    out = []
    for name in SETS:
        path = root / name
        if path.is_dir() and name == "edge-cases":
            out += [pytest.param(p, id=f"edge-cases/{p.name}") for p in files(path)]
        elif path.exists():
            out.append(pytest.param(path, id=name))
    return out


def frames_of(site: str) -> list[str]:
    """The event names a call site is made of: a python frame, or enclosing ops joined by ' < '."""
    return [part.strip() for part in site.split(" < ")]


def in_trace(path: Path, site: str) -> bool:
    known = names(path)
    # a python frame's file may be shortened (deepspeed/...): match the tail of the raw name
    return all(any(n == part or n.endswith(part) for n in known) for part in frames_of(site))


@pytest.mark.parametrize("path", cases())
def test_every_finding_is_founded_on_the_raw_events(path: Path) -> None:
    report = diagnosed(path)
    ranks = {r.rank for r in report.ranks}
    steps = {r.rank: max(1, len(r.steps)) for r in report.ranks}
    exposed = {r.rank: r.exposed_per_step() for r in report.ranks}
    for f in report.findings:
        assert set(f.ranks) <= ranks, f.rule
        assert f.cost_us >= 0
        check = CHECKS.get(f.rule)
        if f.rule in SYNC_RULES:
            check = sync_is_founded
        assert check is not None, f"{f.rule}: no check for this rule on real traces yet"
        check(path, f, exposed, steps)


def sync_is_founded(path: Path, f: Finding, exposed: dict[Any, float], steps: dict[Any, int]) -> None:
    ev = f.evidence
    assert set(ev["calls"]) <= names(path), ev["calls"]  # the calls are in the trace
    assert ev["waited_calls"] >= 1  # at least one of them waited for GPU work
    assert ev["awaited"], "what the calls waited for"
    if ev.get("call_site"):
        assert in_trace(path, ev["call_site"]), ev["call_site"]


def wait_is_founded(path: Path, f: Finding, exposed: dict[Any, float], steps: dict[Any, int]) -> None:
    ev = f.evidence
    if ev.get("call_site"):
        assert in_trace(path, ev["call_site"]), ev["call_site"]
        assert "cudaStreamWaitEvent" in names(path) or "Stream Wait Event" in names(path)
    assert ev["stalls_per_step"] > 0
    assert f.cost_us <= max(exposed[r] for r in f.ranks) + 1e-6 or ev["waited_for"] == "non-communication work"


def straggler_is_founded(path: Path, f: Finding, exposed: dict[Any, float], steps: dict[Any, int]) -> None:
    ev = f.evidence
    assert ev["rank"] == f.ranks[0]
    telling = [k for k, v in ev["by_kind"].items() if v.get("telling")]
    assert telling, ev["by_kind"]
    for kind in telling:
        v = ev["by_kind"][kind]
        assert v["informative"] <= v["collectives"] and v["last_to_arrive"] <= v["informative"]
        assert v["own_wait_us_per_step"] <= 0.5 * v["others_wait_us_per_step"] + 1e-6


def unexplained_is_founded(path: Path, f: Finding, exposed: dict[Any, float], steps: dict[Any, int]) -> None:
    ev = f.evidence
    # what it reports is exposed time of the trace, split without double counting
    assert ev["explained_us_per_step"] + ev["inherent_us_per_step"] + ev["unexplained_us_per_step"] <= (
        ev["exposed_us_per_step"] + 0.01
    )
    assert f.cost_us <= max(exposed[r] for r in f.ranks) * 1.01 + 1.0
    located = sum(loc["exposed_us_per_step"] for loc in ev["by_location"])
    assert located <= ev["unexplained_us_per_step"] * 1.01 + 0.01
    for loc in ev["by_location"]:
        if loc["call_site"]:
            assert in_trace(path, loc["call_site"]), loc["call_site"]


def _host_starved_per_step(trace: Path) -> tuple[float, float]:
    """From one trace file's raw events, independently of the reader: per ProfilerStep, the gaps on the stream with
    the most kernels where an activity's runtime call (`cudaLaunchKernel`, `cudaMemcpyAsync`, ...: by correlation)
    began at least 10 µs after every activity launched before it on that stream had ended, inside a step and with
    no synchronize call overlapping; and the communication kernel time inside those gaps (an upper bound:
    overlapping kernels counted each)."""
    with gzip.open(trace, "rt") as f:
        doc = json.load(f)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    launches = {
        e["args"]["correlation"]: e["ts"]
        for e in events
        if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})
    }
    syncs = [(e["ts"], e["ts"] + e["dur"]) for e in events if "Synchronize" in str(e.get("name", ""))]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    kernels = [
        e
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e.get("args", {}).get("correlation") in launches
    ]
    streams: dict[Any, int] = {}
    for e in kernels:
        streams[e["args"].get("stream")] = streams.get(e["args"].get("stream"), 0) + 1
    compute = max(streams, key=streams.__getitem__)
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in kernels if "nccl" in e["name"].lower() and e["cat"] == "kernel"]
    queue_end, gaps, inside = None, 0, 0.0
    for e in sorted(
        (e for e in kernels if e["args"].get("stream") == compute), key=lambda e: launches[e["args"]["correlation"]]
    ):
        until = min(launches[e["args"]["correlation"]], e["ts"])
        if queue_end is not None and until - queue_end >= 10:
            in_step = any(a <= queue_end and until <= b for a, b in steps)
            if in_step and not any(a < until and b > queue_end for a, b in syncs):
                gaps += 1
                inside += sum(max(0.0, min(until, b) - max(queue_end, a)) for a, b in comm)
        end = e["ts"] + e["dur"]
        queue_end = end if queue_end is None else max(queue_end, end)
    n = max(1, len(steps))
    return gaps / n, inside / n


def host_bound_is_founded(path: Path, f: Finding, exposed: dict[Any, float], steps: dict[Any, int]) -> None:
    ev = f.evidence
    assert "cudaLaunchKernel" in names(path)
    # the raw events hold at least as many host-starved gaps on some rank (the rule leaves out more), and at least
    # the communication it charges runs in them
    found = [_host_starved_per_step(p) for p in files(path)]
    assert max(g for g, _ in found) >= ev["starved_windows_per_step"]
    assert max(c for _, c in found) >= f.cost_us
    assert f.cost_us <= max(exposed[r] for r in f.ranks) + 1e-6
    assert f.fix.config is None and f.fix.env is None


def limit_is_founded(path: Path, f: Finding, exposed: dict[Any, float], steps: dict[Any, int]) -> None:
    assert f.severity == "info" and f.evidence["awaited_gathers_per_step"] > 0


CHECKS = {
    "cross-stream-wait": wait_is_founded,
    "straggler": straggler_is_founded,
    "unexplained-exposure": unexplained_is_founded,
    "allgather-transfer-bound": limit_is_founded,
    "host-bound-launch": host_bound_is_founded,
}


def test_no_hardware_queue_verdict_on_real_traces() -> None:
    """None of the real traces ran with CUDA_DEVICE_MAX_CONNECTIONS=1: their serialization, where any, is explicit
    waits (DLRM's all-to-all waits, DDP's all-reduce waits)."""
    root = shared_traces_dir()
    if root is None:
        pytest.skip("no ../shared/traces")
    for case in cases():
        (path,) = case.values
        rules = {f.rule for f in diagnosed(path).findings}
        assert "no-stream-concurrency" not in rules, path
