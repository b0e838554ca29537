"""The simulator presets added for GitHub issue 11 item 7, on 2 nodes x 4 GPUs: each planted property as seen in
the raw trace events, and each cause's counterfactual cost in truth.json (docs/simulator.md, "Presets")."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from builders import SimulatedSets

from overlapcheck.simulate import build_config, generate, simulate
from overlapcheck.simulate.frames import DATALOADER_FRAMES, USER_GRAD_HOOK, WAIT_STREAM
from overlapcheck.simulate.truth import mean_step_time

SIZE: dict[str, Any] = {"nodes": 2, "gpus_per_node": 4}
NEW = ("partial-straggler", "host-straggler", "throttle-delayed-gathers", "user-wait-stream", "harmless-config")
COMPUTE, REDUCE_STREAM = 7, 17
Event = dict[str, Any]


class Sets:
    """NEW's sets by name, each simulated when a test first asks for it: the same sets (2x4, the causes costed)
    as test_diagnose_presets.py's, from the session's `simulated` cache. These tests read the causes' costs,
    never the inherent costs or free_comm_us."""

    def __init__(self, simulated: SimulatedSets):
        self.simulated = simulated

    def __getitem__(self, name: str) -> Path:
        assert name in NEW
        return self.simulated.folder(name, **SIZE, inherent_costs=False)


@pytest.fixture
def sets(simulated: SimulatedSets) -> Sets:
    return Sets(simulated)


def events(folder: Path, rank: int) -> list[Event]:
    with gzip.open(folder / f"rank{rank}.trace.json.gz") as f:
        return json.load(f)["traceEvents"]


def truth(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "truth.json").read_text())


def world(folder: Path) -> int:
    return len(truth(folder)["ranks"])


def inside(ev: Event, outer: Event) -> bool:
    return outer["tid"] == ev["tid"] and outer["ts"] <= ev["ts"] and ev["ts"] + ev["dur"] <= outer["ts"] + outer["dur"]


def of_cat(evs: list[Event], cat: str, name: str | None = None) -> list[Event]:
    return [e for e in evs if e.get("cat") == cat and (name is None or e["name"] == name)]


def kind(kernel: Event) -> str | None:
    for key, value in (("AllGather", "all_gather"), ("ReduceScatter", "reduce_scatter"), ("AllReduce", "all_reduce")):
        if kernel["name"].startswith("nccl") and key in kernel["name"]:
            return value
    return None


def collectives(folder: Path) -> dict[tuple[str, str, int], dict[int, float]]:
    """(process group, kind, n-th) -> {rank: kernel duration}, matched across ranks like the straggler rule."""
    table: dict[tuple[str, str, int], dict[int, float]] = {}
    for rank in range(world(folder)):
        seen: Counter[tuple[str, str]] = Counter()
        kernels = sorted((e for e in of_cat(events(folder, rank), "kernel") if kind(e)), key=lambda e: e["ts"])
        for k in kernels:
            key = (k["args"]["Process Group Name"], kind(k) or "")
            seen[key] += 1
            table.setdefault((*key, seen[key]), {})[rank] = k["dur"]
    return table


def last_arrivals(folder: Path, rank: int) -> dict[str, tuple[int, int]]:
    """Per kind: (collectives where `rank` arrives last, collectives whose durations differ by >= 2 us)."""
    out: dict[str, list[int]] = {}
    for (_, k, _), durs in collectives(folder).items():
        if len(durs) < world(folder) or max(durs.values()) - min(durs.values()) < 2.0:
            continue
        last = min(durs, key=durs.__getitem__)  # kernels end together: the shortest one started last
        counts = out.setdefault(k, [0, 0])
        counts[0] += last == rank
        counts[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


def only_cause(folder: Path, rule: str | None = None) -> dict[str, Any]:
    """The preset's planted cause (of `rule`, when the preset plants others too)."""
    t = truth(folder)
    causes = [c for c in t["causes"] if rule is None or c["rule"] == rule]
    assert len(causes) == 1
    cause = causes[0]
    assert cause["cost_us"] == pytest.approx(t["step_time_us"] - cause["step_time_without_us"], abs=1e-2)
    assert cause["cost_us"] >= 0.05 * t["step_time_us"]  # costs at least 5 % of the step
    return cause


def steps(evs: list[Event]) -> list[Event]:
    return sorted(
        (e for e in of_cat(evs, "user_annotation") if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )


# -- partial-straggler ---------------------------------------------------------------------------------------
def test_partial_straggler_is_last_at_reduce_scatters_not_at_all_gathers(sets: Sets) -> None:
    folder = sets["partial-straggler"]
    cause = only_cause(folder)
    assert cause["rule"] == "straggler" and cause["late_on"] == "gpu" and cause["fix"] == {}
    (rank,) = cause["ranks"]
    counts = last_arrivals(folder, rank)
    ag_last, ag_informative = counts["all_gather"]
    rs_last, rs_informative = counts["reduce_scatter"]
    assert ag_informative > 0 and ag_last < 0.5 * ag_informative  # prefetched gathers absorb the slow GPU
    assert rs_last > 0.5 * rs_informative  # reduce-scatters wait for its gradients
    total_last = sum(c[0] for c in counts.values())
    total = sum(c[1] for c in counts.values())
    assert total_last < 0.5 * total  # it loses a vote over all collectives together


def test_partial_straggler_slows_gemms_but_not_memory_bound_kernels(sets: Sets) -> None:
    folder = sets["partial-straggler"]
    (rank,) = only_cause(folder)["ranks"]
    other = (rank + 1) % world(folder)

    def total(r: int, word: str) -> float:
        return sum(e["dur"] for e in of_cat(events(folder, r), "kernel") if word in e["name"] and e["tid"] == COMPUTE)

    assert total(rank, "gemm") / total(other, "gemm") == pytest.approx(1.5, rel=0.05)
    cats = [sum(e["dur"] for e in of_cat(events(folder, r), "kernel") if e["tid"] == 13) for r in (rank, other)]
    assert cats[0] == pytest.approx(cats[1], rel=0.03)  # the all-gather stream's torch.cat kernels: HBM-bound


# -- host-straggler ------------------------------------------------------------------------------------------
def first_launch_delay(evs: list[Event]) -> list[float]:
    """Per step: time from the ProfilerStep#N start to its first kernel / memcpy launch."""
    launches = [e for e in of_cat(evs, "cuda_runtime") if e["name"].startswith(("cudaLaunch", "cudaMemcpy"))]
    return [min(e["ts"] for e in launches if inside(e, s)) - s["ts"] for s in steps(evs)]


def test_host_straggler_waits_in_its_data_loader_before_the_first_launch(sets: Sets) -> None:
    folder = sets["host-straggler"]
    cause = only_cause(folder)
    assert cause["rule"] == "straggler" and cause["late_on"] == "host" and cause["fix"] == {}
    assert cause["frames"] == list(DATALOADER_FRAMES)
    (rank,) = cause["ranks"]
    evs = events(folder, rank)
    launches = [e for e in of_cat(evs, "cuda_runtime") if e["name"].startswith("cudaLaunch")]
    for step in steps(evs):
        outer, inner = (
            next(e for e in of_cat(evs, "python_function", name) if inside(e, step)) for name in DATALOADER_FRAMES
        )
        assert inside(inner, outer) and inner["args"]["Python parent id"] == outer["args"]["Python id"]
        assert outer["dur"] >= 8000.0
        first = min(e["ts"] for e in launches if inside(e, step))
        assert outer["ts"] + outer["dur"] <= first  # the delay comes before the step's first launch
    assert min(first_launch_delay(evs)) >= 8000.0
    for other in range(world(folder)):
        if other != rank:
            assert max(first_launch_delay(events(folder, other))) < 1000.0
            assert not [e for e in of_cat(events(folder, other), "python_function") if "dataloader" in e["name"]]


def test_host_straggler_makes_the_others_wait_in_their_first_all_gather(sets: Sets) -> None:
    folder = sets["host-straggler"]
    (rank,) = only_cause(folder)["ranks"]
    durs = {}
    for r in range(world(folder)):
        evs = events(folder, r)
        kernels = {e["args"]["correlation"]: e for e in of_cat(evs, "kernel") if kind(e) == "all_gather"}
        launches = sorted(
            (e for e in of_cat(evs, "cuda_runtime") if e["args"]["correlation"] in kernels), key=lambda e: e["ts"]
        )
        durs[r] = [kernels[next(e for e in launches if inside(e, s))["args"]["correlation"]]["dur"] for s in steps(evs)]
    for r, per_step in durs.items():
        if r == rank:
            assert max(per_step) < 3500.0  # its own first gather is only the transfer
        else:
            assert min(per_step) > max(durs[rank]) + 4000.0  # the others wait most of the 8 ms inside NCCL


# -- throttle-delayed-gathers --------------------------------------------------------------------------------
def test_throttle_blocks_the_backward_host_and_the_next_gathers_launch_after_it(sets: Sets, tmp_path: Path) -> None:
    folder = sets["throttle-delayed-gathers"]
    cause = only_cause(folder, "reduce-event-throttle")
    assert cause["rule"] == "reduce-event-throttle"
    assert cause["fix"] == {"config": {"zero_optimization.reduce_bucket_size": 50_000_000}}
    cfg, _ = build_config("throttle-delayed-gathers", **SIZE)
    assert cause["step_time_without_us"] == pytest.approx(
        mean_step_time(simulate(cfg.with_overrides({"reduce_event_throttle": False}))), abs=1e-2
    )
    evs = events(folder, 0)
    flushes = [e for e in of_cat(evs, "python_function") if e["name"].endswith("__reduce_and_partition_ipg_grads")]
    blocked = [
        e
        for e in of_cat(evs, "cuda_runtime", "cudaEventSynchronize")
        if e["dur"] >= 100.0 and any(inside(e, f) for f in flushes)
    ]
    throttles = [e for e in blocked if e["dur"] >= 1000.0]
    assert throttles  # the autograd thread blocks for milliseconds in the reduce-event throttle
    gathers = of_cat(evs, "cpu_op", "c10d::_allgather_base_")
    after = [
        g for t in blocked for g in gathers if g["tid"] == t["tid"] and 0 <= g["ts"] - (t["ts"] + t["dur"]) < 1000.0
    ]
    assert len(after) >= len(steps(evs))  # the backward prefetch is issued only once the throttle returned
    # what it costs: the GPU waits for the throttled host's launches (compute-stream gaps that end when the kernel's
    # launch returns), beyond those of the same job without the throttle (its trace written from the counterfactual)
    from overlapcheck.simulate.writer import write_trace

    without = simulate(cfg.with_overrides({"reduce_event_throttle": False}))
    write_trace(without.cfg, without.ranks[0], tmp_path / "rank0.trace.json.gz")
    extra = launch_bound_idle(evs) - launch_bound_idle(events(tmp_path, 0))
    assert extra * len(steps(evs)) == pytest.approx(cause["cost_us"] * len(steps(evs)), rel=0.25)


def launch_bound_idle(evs: list[Event]) -> float:
    """Per step: compute-stream idle time that ends when the next kernel's launch call returns."""
    runtime = {e["args"]["correlation"]: e for e in of_cat(evs, "cuda_runtime")}
    compute = sorted((e for e in of_cat(evs, "kernel") if e["tid"] == COMPUTE), key=lambda e: e["ts"])
    idle = 0.0
    for a, b in zip(compute, compute[1:], strict=False):
        launch = runtime[b["args"]["correlation"]]
        if b["ts"] - (a["ts"] + a["dur"]) > 20.0 and b["ts"] - (launch["ts"] + launch["dur"]) < 10.0:
            idle += b["ts"] - (a["ts"] + a["dur"])
    return idle / len(steps(evs))


def test_throttle_costs_nothing_with_a_fast_host(tmp_path: Path) -> None:
    """The same job with the Python cost of the deep module tree removed: the host runs far ahead again."""
    cfg, _ = build_config("throttle-delayed-gathers", **SIZE)
    fast = cfg.with_overrides({"backward_host_us": 0.0})
    cost = mean_step_time(simulate(fast)) - mean_step_time(
        simulate(fast.with_overrides({"reduce_event_throttle": False}))
    )
    assert abs(cost) < 0.01 * mean_step_time(simulate(fast))


# -- user-wait-stream ----------------------------------------------------------------------------------------
def test_user_grad_hook_makes_compute_wait_for_each_reduce_scatter(sets: Sets) -> None:
    folder = sets["user-wait-stream"]
    cause = only_cause(folder)
    assert cause["rule"] == "cross-stream-wait" and cause["fix"] == {}
    assert cause["call_site"] == USER_GRAD_HOOK and cause["ranks"] == list(range(world(folder)))
    evs = events(folder, 0)
    hooks = of_cat(evs, "python_function", USER_GRAD_HOOK)
    waits_in = of_cat(evs, "python_function", WAIT_STREAM)
    accumulate = of_cat(evs, "cpu_op", "autograd::engine::evaluate_function: torch::autograd::AccumulateGrad")
    waits = [
        e
        for e in of_cat(evs, "cuda_runtime", "cudaStreamWaitEvent")
        if any(inside(e, w) for w in waits_in) and any(inside(e, h) for h in hooks)
    ]
    assert waits and all(any(inside(w, a) for a in accumulate) for w in waits)
    for w in waits_in:  # torch's wait_stream is called by the user's hook, the innermost train.py frame
        parent = next(h for h in hooks if inside(w, h))
        assert w["args"]["Python parent id"] == parent["args"]["Python id"]
    syncs = {e["args"]["correlation"]: e for e in of_cat(evs, "cuda_sync", "Stream Wait Event")}
    for w in waits:  # the cuda_sync record: the compute stream waits on the reduce stream
        sync = syncs[w["args"]["correlation"]]
        assert sync["args"]["stream"] == COMPUTE and sync["args"]["wait_on_stream"] == REDUCE_STREAM
    scatters = sorted(of_cat(evs, "cpu_op", "c10d::_reduce_scatter_base_"), key=lambda e: e["ts"])
    autograd_scatters = [s for s in scatters if s["tid"] == waits[0]["tid"]]
    assert autograd_scatters
    for s in autograd_scatters:  # after each reduce-scatter launch in backward, the hook's wait follows
        assert any(0 < w["ts"] - s["ts"] < 2000.0 for w in waits)
    # compute kernels that start exactly when reduce-stream work ends, after the compute stream idled
    reduce_ends = {round(e["ts"] + e["dur"], 3) for e in evs if e.get("tid") == REDUCE_STREAM and e.get("ph") == "X"}
    compute = sorted((e for e in of_cat(evs, "kernel") if e["tid"] == COMPUTE), key=lambda e: e["ts"])
    held = [
        b
        for a, b in zip(compute, compute[1:], strict=False)
        if b["ts"] - (a["ts"] + a["dur"]) > 10.0 and any(abs(b["ts"] - end) < 0.01 for end in reduce_ends)
    ]
    assert len(held) >= len(autograd_scatters) // 2


# -- harmless-config -----------------------------------------------------------------------------------------
def test_harmless_config_plants_nothing_and_costs_nothing(sets: Sets) -> None:
    folder = sets["harmless-config"]
    t = truth(folder)
    assert t["causes"] == []
    ds = json.loads((folder / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage3_prefetch_bucket_size"] == 1_000_000
    cfg, _ = build_config("harmless-config", **SIZE)
    default = mean_step_time(simulate(cfg.with_overrides({"prefetch_bucket_size": 50_000_000})))
    assert abs(t["step_time_us"] - default) < 0.01 * t["step_time_us"]
    # the gathers are still prefetched: in forward the first fetch gathers its module and the next, every later
    # fetch only the next module (as with the default bucket), never its own
    evs = events(folder, 0)
    forward = [e for e in of_cat(evs, "python_function") if e["name"].endswith("): forward")]
    fetches = sorted(
        (
            e
            for e in of_cat(evs, "python_function")
            if e["name"].endswith("_fetch_sub_module_impl") and any(inside(e, f) for f in forward)
        ),
        key=lambda e: e["ts"],
    )
    gathers = of_cat(evs, "cpu_op", "c10d::_allgather_base_")
    per_fetch = [sum(1 for g in gathers if inside(g, f)) for f in fetches]
    layers = build_config("harmless-config", **SIZE)[0].model.layers
    assert per_fetch == ([2] + [1] * (layers - 1) + [0]) * len(steps(evs))


# -- combinations and the old presets ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("scenario", "rules"),
    [
        ("host-straggler+throughput-timer", {"straggler", "throughput-timer-sync"}),
        ("user-wait-stream+bucket-too-large", {"cross-stream-wait", "reduce-scatter-deferred"}),
    ],
)
def test_combined_presets_list_each_cause_with_its_own_cost(tmp_path: Path, scenario: str, rules: set[str]) -> None:
    t = generate(scenario, tmp_path, nodes=2, gpus_per_node=2)
    assert {c["rule"] for c in t["causes"]} == rules and len(t["causes"]) == 2
    cfg, keys = build_config(scenario, nodes=2, gpus_per_node=2)
    from overlapcheck.simulate.scenarios import CAUSES

    for key in keys:
        cause = next(c for c in t["causes"] if c["rule"] == (CAUSES[key].rule or key))
        without = mean_step_time(simulate(cfg.with_overrides(CAUSES[key].counterfactual(cfg))))
        assert cause["step_time_without_us"] == pytest.approx(without, abs=1e-2)
    if scenario.startswith("host-straggler"):
        assert next(c for c in t["causes"] if c["rule"] == "straggler")["late_on"] == "host"


def test_straggler_presets_combine_into_one_effect() -> None:
    for scenario, rank_key in (("partial-straggler+straggler", "straggler"), ("straggler+partial-straggler", "gpu")):
        cfg, keys = build_config(scenario, **SIZE)
        assert len(keys) == 1 and (keys[0] == "straggler") == (rank_key == "straggler")
        assert cfg.straggler_scope == ("all" if rank_key == "straggler" else "math")
    _, keys = build_config("host-straggler+straggler", **SIZE)
    assert keys == ["host-straggler", "straggler"]  # a slow host and a slow GPU are two effects


def test_old_presets_keep_their_truth_config(tmp_path: Path) -> None:
    """Fields added with these presets are written only where set, so the shipped sets stay byte-identical."""
    t = generate("straggler", tmp_path / "old", costs=False, nodes=2, gpus_per_node=1)
    assert not {"straggler_scope", "host_delay_rank", "host_delay_us", "user_wait_stream"} & set(t["config"])
    t = generate("host-straggler", tmp_path / "new", costs=False, nodes=2, gpus_per_node=1)
    assert t["config"]["host_delay_rank"] == 1 and t["config"]["host_delay_us"] == 8000.0
