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


def limit_is_founded(path: Path, f: Finding, exposed: dict[Any, float], steps: dict[Any, int]) -> None:
    assert f.severity == "info" and f.evidence["awaited_gathers_per_step"] > 0


CHECKS = {
    "cross-stream-wait": wait_is_founded,
    "straggler": straggler_is_founded,
    "unexplained-exposure": unexplained_is_founded,
    "allgather-transfer-bound": limit_is_founded,
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
