"""The cross-rank slow-node rule (diagnose/rules/stragglers.py `slow_node`) on hand-built 8-rank traces (2 nodes
of 4 GPUs) whose waits are set by hand: a node whose GPUs all compute longer is named, with the other ranks'
waiting as what it explains; one slow rank stays a `straggler`; a node that only transfers slowly (its NIC), a
slow network and jitter are no slow node."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from test_rule_straggler import AR, GEMM, RS, Trace

from overlapcheck.model import Finding
from overlapcheck.pipeline import analyze

NODES, PER_NODE = 2, 4
RANKS = NODES * PER_NODE
SLOW = range(4, 8)  # node 1's ranks


def write(folder: Path, traces: list[Trace], hosts: bool = True) -> Path:
    from builders import write_trace

    folder.mkdir(parents=True, exist_ok=True)
    for rank, t in enumerate(traces):
        top = {"host_name": f"gpu-host-{rank // PER_NODE}"} if hosts else {}
        write_trace(folder, f"rank{rank}.trace.json.gz", t.events, rank=rank, world_size=len(traces), **top)
    return folder


def found(folder: Path, rule: str) -> list[Finding]:
    return [f for f in analyze(folder, jobs=1).findings if f.rule == rule]


def lockstep(compute: list[list[float]], transfer: list[list[float]], steps: int = 2) -> list[Trace]:
    """Per step, 6 collectives (all-reduces and reduce-scatters in turn), each after a GEMM: rank r computes
    `compute[i][r]` µs before collective i and the collective's kernels end together on every rank, `transfer[i]
    [r]` µs after the last rank arrived (its kernel: the wait for the last arrival plus that)."""
    traces = [Trace() for _ in range(RANKS)]
    for s in range(steps):
        base = 50_000.0 * s
        for t in traces:
            t.step(s + 1, base, 45_000)
        g = base + 100
        for i, (c, x) in enumerate(zip(compute, transfer, strict=True)):
            arrive = max(c)
            for r, t in enumerate(traces):
                t.gpu(GEMM, base + 10 + 5 * i, g, c[r])
                t.gpu(AR if i % 2 else RS, base + 11 + 5 * i, g + c[r], arrive - c[r] + x[r])
            g += arrive + max(x) + 50
    return traces


def slow_node_traces(seed: int = 3) -> list[Trace]:
    """Node 1's GPUs compute 1330-1350 µs before each collective, node 0's 1000 (± 20); the last to arrive
    rotates among node 1's ranks (40 µs later than the rest of its node); every transfer takes 200 µs."""
    rng = random.Random(seed)
    compute = [
        [
            (1330.0 + rng.randint(0, 20) + (40.0 if r == SLOW[i % len(SLOW)] else 0.0))
            if r in SLOW
            else 1000.0 + rng.randint(-20, 20)
            for r in range(RANKS)
        ]
        for i in range(6)
    ]
    return lockstep(compute, [[200.0] * RANKS for _ in range(6)])


def test_a_slow_node_is_named_by_host_with_its_extra_compute(tmp_path: Path) -> None:
    traces = slow_node_traces()
    folder = write(tmp_path, traces)
    report = analyze(folder, jobs=1)
    rules = [f.rule for f in report.findings]
    assert "straggler" not in rules
    (f,) = [f for f in report.findings if f.rule == "slow-node"]
    assert report.findings[0] is f
    assert f.ranks == list(SLOW) and f.evidence["late_on"] == "gpu"
    assert f.title == "Node gpu-host-1 (ranks 4-7) is slow (slow on the GPU)"
    assert f.evidence["hosts"] == ["gpu-host-1"]
    # the raw events: per rank, GEMM time per step and the waits inside its collectives
    gemm: dict[int, float] = {}
    waits: dict[int, float] = {}
    for rank, t in enumerate(traces):
        kernels = [e for e in t.events if e.get("cat") == "kernel"]
        gemm[rank] = sum(e["dur"] for e in kernels if e["name"] == GEMM) / 2
        waits[rank] = sum(e["dur"] - 200.0 for e in kernels if e["name"] in (AR, RS)) / 2
    slow_compute = sorted(gemm[r] for r in SLOW)
    fast_compute = sorted(gemm[r] for r in range(RANKS) if r not in SLOW)
    assert min(slow_compute) > max(fast_compute)  # every slow rank computes longer than every other
    extra = (slow_compute[1] + slow_compute[2]) / 2 - (fast_compute[1] + fast_compute[2]) / 2
    assert f.cost_us == pytest.approx(extra, abs=0.01)  # medians of 4: the mean of the middle two
    assert f.evidence["own_wait_us_per_step"]["group_max"] == pytest.approx(max(waits[r] for r in SLOW), abs=0.01)
    # no single rank of the node arrives last at half of the collectives' spread: the straggler rule cannot see it
    shortest = [
        min(range(RANKS), key=lambda r: t_dur[r])
        for t_dur in zip(
            *[[e["dur"] for e in t.events if e.get("cat") == "kernel" and e["name"] in (AR, RS)] for t in traces],
            strict=True,
        )
    ]
    assert all(r in SLOW for r in shortest) and max(shortest.count(r) for r in SLOW) < len(shortest) / 2
    assert "thermals" in f.why


def test_without_host_names_a_slow_node_is_named_by_rank_range_and_gpus_per_node(tmp_path: Path) -> None:
    folder = write(tmp_path, slow_node_traces(), hosts=False)
    (tmp_path / "run.json").write_text(json.dumps({"gpus_per_node": PER_NODE}))
    (f,) = found(folder, "slow-node")
    assert f.title == "Node 1 (ranks 4-7, 4 GPUs per node) is slow (slow on the GPU)"
    assert f.evidence["node"] == 1 and f.evidence["hosts"] is None


def test_the_slow_node_explains_the_others_waiting_once(tmp_path: Path) -> None:
    report = analyze(write(tmp_path, slow_node_traces()), jobs=1)
    (f,) = [f for f in report.findings if f.rule == "slow-node"]
    waiting = f.evidence["others_wait_us_per_step"]["median"]
    assert waiting > 2_000  # node 0's ranks wait ~350 µs exposed at each of 6 collectives per step
    rules = [f.rule for f in report.findings]
    assert "peer-wait" not in rules and "cross-stream-wait" not in rules
    # what is left unexplained on node 0's ranks is their exposed transfers (6 x 200 µs per step), not the waits
    (left,) = [f for f in report.findings if f.rule == "unexplained-exposure"]
    assert left.cost_us < 6 * 200 + f.evidence["own_wait_us_per_step"]["group_max"] < waiting


def test_one_slow_rank_is_still_a_straggler(tmp_path: Path) -> None:
    rng = random.Random(5)
    compute = [[(1350.0 if r == 6 else 1000.0) + rng.randint(-20, 20) for r in range(RANKS)] for _ in range(6)]
    folder = write(tmp_path, lockstep(compute, [[200.0] * RANKS for _ in range(6)]))
    report = analyze(folder, jobs=1)
    assert not [f for f in report.findings if f.rule == "slow-node"]
    (f,) = [f for f in report.findings if f.rule == "straggler"]
    assert f.ranks == [6] and f.evidence["late_on"] == "gpu"


@pytest.mark.symptom_without_cause("slow-node")
def test_a_node_with_a_slow_nic_is_no_slow_node(tmp_path: Path) -> None:
    # every rank computes 1000 µs (± 20); node 1's collectives end 600 µs after node 0's (its NIC moves the bytes
    # slowly): node 0's ranks wait less, as a slow node's would, but node 1's compute is not longer
    rng = random.Random(7)
    compute = [[1000.0 + rng.randint(-20, 20) for _ in range(RANKS)] for _ in range(6)]
    transfer = [[800.0 if r in SLOW else 200.0 for r in range(RANKS)] for _ in range(6)]
    traces = lockstep(compute, transfer)
    report = analyze(write(tmp_path, traces), jobs=1)
    assert not [f for f in report.findings if f.rule in ("slow-node", "straggler")]
    # the symptom is there: node 1's ranks wait 600 µs more per collective than node 0's
    durs = {
        r: [e["dur"] for e in t.events if e.get("cat") == "kernel" and e["name"] in (AR, RS)]
        for r, t in enumerate(traces)
    }
    assert min(sum(durs[r]) for r in SLOW) - max(sum(durs[r]) for r in range(4)) > 6_000


def test_a_slow_network_and_jitter_are_no_slow_node(tmp_path: Path) -> None:
    rng = random.Random(11)
    compute = [[1000.0 + rng.randint(-20, 20) for _ in range(RANKS)] for _ in range(6)]
    slow_net = lockstep(compute, [[5000.0] * RANKS for _ in range(6)])
    assert not found(write(tmp_path / "network", slow_net), "slow-node")
    # large spreads whose last rank is any rank at random
    compute = [[1000.0 + rng.randint(0, 600) for _ in range(RANKS)] for _ in range(6)]
    jitter = lockstep(compute, [[200.0] * RANKS for _ in range(6)])
    assert not found(write(tmp_path / "jitter", jitter), "slow-node")


def test_a_node_named_in_the_run_manifest_is_named_by_its_host(tmp_path: Path) -> None:
    folder = write(tmp_path, slow_node_traces(), hosts=False)
    ranks = [{"rank": r, "host": f"dgx-{r // PER_NODE:02d}"} for r in range(RANKS)]
    (tmp_path / "run.json").write_text(json.dumps({"gpus_per_node": PER_NODE, "ranks": ranks}))
    (f,) = found(folder, "slow-node")
    assert f.title == "Node dgx-01 (ranks 4-7) is slow (slow on the GPU)" and f.evidence["hosts"] == ["dgx-01"]


LATE_US = 3_000.0


def test_a_node_whose_hosts_start_each_step_late_is_a_slow_node_on_the_host(tmp_path: Path) -> None:
    # the same GPU work everywhere; node 1's data loaders take 3000 µs more (+ 0-30 µs, a different rank last
    # each step) before each step's first launch, an all-gather: node 0's ranks wait in it, exposed
    from test_rule_straggler import AG, LOADER, SITE

    rng = random.Random(2)
    traces = [Trace() for _ in range(RANKS)]
    for s in range(4):
        base = 20_000.0 * s
        loaders = [40.0 + (LATE_US + rng.randint(0, 30) if r in SLOW else rng.randint(0, 5)) for r in range(RANKS)]
        end_of_first = base + 5 + max(loaders) + 10 + 5 + 300  # the last rank's first all-gather ends
        for r, t in enumerate(traces):
            t.frame("/work/train.py(30): main", base - 100, 19_000)
            t.step(s + 1, base, 18_000)
            t.frame("/work/train.py(52): next_batch", base + 5, loaders[r] + 10)
            t.frame(LOADER, base + 10, loaders[r])
            t.frame(f"{SITE}(1328): _next_data", base + 11, loaders[r] - 2)
            first = base + 5 + loaders[r] + 10 + 5
            t.gpu(AG, first, first + 5, end_of_first - (first + 5))
            host, g = first + 10, end_of_first
            for _ in range(6):
                t.gpu(GEMM, host, g, 1000)
                t.gpu(RS, host + 1, g + 1000, 200)
                host, g = host + 5, g + 1250
    report = analyze(write(tmp_path, traces), jobs=1)
    assert not [f for f in report.findings if f.rule == "straggler"]
    (f,) = [f for f in report.findings if f.rule == "slow-node"]
    assert f.ranks == list(SLOW) and f.evidence["late_on"] == "host"
    assert f.title == "Node gpu-host-1 (ranks 4-7) is slow (late on the host)"
    # its cost: node 0's exposed waiting in the first all-gathers, about 3000 µs per step
    assert f.cost_us == f.evidence["others_wait_us_per_step"]["median"]
    assert LATE_US - 50 < f.cost_us < LATE_US + 50
    assert "input pipeline" in f.why
