"""The ZeRO-3 simulator: determinism, the planted effects as seen in the raw events, truth consistency, CLI."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from builders import SimulatedSets
from click.testing import CliRunner

from overlapcheck.cli import main
from overlapcheck.simulate import build_config, generate, truth_document
from overlapcheck.simulate.scenarios import PRESETS
from overlapcheck.simulate.sim import TS_ORIGIN_US
from overlapcheck.simulate.truth import KINDS, intersect, length, merge, subtract

SMALL = {"nodes": 2, "gpus_per_node": 1}


class Sets:
    """Every preset but seed-5201 on 2 nodes x 1 GPU (and "healthy-2x2": healthy on 2 x 2 for intra-node checks), by
    name, each simulated once per session when a test first asks for it (conftest.py's `simulated`)."""

    def __init__(self, simulated: SimulatedSets):
        self.simulated = simulated

    def __getitem__(self, name: str) -> Path:
        if name == "healthy-2x2":
            return self.simulated.folder("healthy", nodes=2, gpus_per_node=2)
        assert name in PRESETS and name != "seed-5201", name
        return self.simulated.folder(name, **SMALL)


@pytest.fixture
def sets(simulated: SimulatedSets) -> Sets:
    return Sets(simulated)


def events(folder: Path, rank: int = 0) -> list[dict[str, Any]]:
    with gzip.open(folder / f"rank{rank}.trace.json.gz") as f:
        return json.load(f)["traceEvents"]


def truth(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "truth.json").read_text())


def named(evs: list[dict[str, Any]], name: str, cat: str | None = None) -> list[dict[str, Any]]:
    return [e for e in evs if e.get("name") == name and (cat is None or e.get("cat") == cat)]


def inside(ev: dict[str, Any], frames: list[dict[str, Any]]) -> bool:
    """Whether `ev` runs inside one of `frames` on the same thread."""
    return any(
        f["tid"] == ev["tid"] and f["ts"] <= ev["ts"] and ev["ts"] + ev["dur"] <= f["ts"] + f["dur"] for f in frames
    )


def frames_named(evs: list[dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    return [e for e in evs if e.get("cat") == "python_function" and e["name"].endswith(suffix)]


def gpu(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in evs if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]


def is_nccl(e: dict[str, Any]) -> bool:
    return e.get("cat") == "kernel" and e["name"].startswith("nccl")


# -- determinism ---------------------------------------------------------------------------------
def test_same_seed_gives_identical_files(tmp_path: Path) -> None:
    generate("straggler", tmp_path / "a", seed=3, **SMALL)
    generate("straggler", tmp_path / "b", seed=3, **SMALL)
    for f in sorted((tmp_path / "a").iterdir()):
        assert f.read_bytes() == (tmp_path / "b" / f.name).read_bytes(), f.name


def test_other_seed_gives_other_times(tmp_path: Path) -> None:
    generate("healthy", tmp_path / "a", costs=False, seed=1, **SMALL)
    generate("healthy", tmp_path / "b", costs=False, seed=2, **SMALL)
    assert truth(tmp_path / "a")["step_time_us"] != truth(tmp_path / "b")["step_time_us"]


# -- planted effects, seen in the raw events -------------------------------------------------------
def test_healthy_hides_most_communication(sets: Sets) -> None:
    for rank in truth(sets["healthy-2x2"])["ranks"]:
        assert rank["collectives"]["all"]["overlap"] > 0.8
        assert rank["collectives"]["reduce_scatter"]["count"] > 2 * len(rank["steps"])


def test_comms_logger_syncs_after_every_collective(sets: Sets) -> None:
    evs = events(sets["comms-logger"])
    comms = sorted(named(evs, "record_param_comms"), key=lambda e: e["ts"])
    syncs = sorted(e["ts"] for e in named(evs, "cudaDeviceSynchronize", "cuda_runtime"))
    assert comms and len(syncs) >= len(comms)
    for this, nxt in zip(comms, comms[1:] + [None], strict=True):
        end = nxt["ts"] if nxt else float("inf")
        assert any(this["ts"] + this["dur"] <= s < end for s in syncs), this["args"]["Collective name"]
    assert not named(events(sets["healthy"]), "cudaDeviceSynchronize", "cuda_runtime")


def test_no_overlap_comm_uses_only_the_default_stream_for_deepspeed_work(sets: Sets) -> None:
    evs = events(sets["no-overlap-comm"])
    assert {e["tid"] for e in gpu(evs) if not is_nccl(e)} == {7}
    assert {e["tid"] for e in gpu(events(sets["healthy"])) if not is_nccl(e)} == {7, 13, 17}


def test_same_communicator_serializes_its_kernels(sets: Sets) -> None:
    evs = events(sets["same-communicator"])
    names = {(e["args"]["Collective name"], e["args"]["Process Group Name"]) for e in named(evs, "record_param_comms")}
    assert ("_allgather_base", "2") in names and ("_reduce_scatter_base", "2") in names
    nccl = sorted((e for e in evs if is_nccl(e) and e["args"].get("Process Group Name") == "2"), key=lambda e: e["ts"])
    assert len({e["tid"] for e in nccl}) == 2  # torch >= 2.8: reduce-scatter on the reduce stream
    for a, b in zip(nccl, nccl[1:], strict=False):
        assert a["ts"] + a["dur"] <= b["ts"] + 1e-3
    healthy = truth(sets["healthy"])["causes"]
    assert healthy == []


def test_max_connections_1_leaves_no_concurrency(sets: Sets) -> None:
    acts = sorted((e["ts"], e["ts"] + e["dur"]) for e in gpu(events(sets["max-connections-1"])))
    for (_, end), (start, _) in zip(acts, acts[1:], strict=False):
        assert end <= start + 1e-3
    for rank in truth(sets["max-connections-1"])["ranks"]:
        assert rank["collectives"]["all"]["overlapped_us"] == pytest.approx(0.0, abs=1e-3)


def test_straggler_makes_the_others_wait_in_nccl(sets: Sets) -> None:
    t = truth(sets["straggler"])
    slow = t["config"]["straggler_rank"]
    (cause,) = t["causes"]
    assert cause["rule"] == "straggler" and cause["ranks"] == [slow] and cause["cost_us"] > 0
    ranks = {r["rank"]: r for r in t["ranks"]}
    other = next(r for r in ranks if r != slow)
    assert ranks[slow]["compute_us"] > 1.2 * ranks[other]["compute_us"]
    assert ranks[other]["collectives"]["all"]["time_us"] > ranks[slow]["collectives"]["all"]["time_us"]


def test_offload_copies_block_the_host(sets: Sets) -> None:
    evs = events(sets["offload-sync"])
    copies = [e for e in evs if e.get("cat") == "gpu_memcpy" and e["name"] == "Memcpy DtoH (Device -> Pageable)"]
    assert copies
    partition = frames_named(evs, ": partition_grads")
    syncs = [e for e in named(evs, "cudaStreamSynchronize", "cuda_runtime") if inside(e, partition)]
    assert len(syncs) == len(copies)


def test_reduce_throttle_blocks_in_reduce_and_partition(sets: Sets) -> None:
    evs = events(sets["reduce-throttle"])
    flush = frames_named(evs, ": __reduce_and_partition_ipg_grads")
    syncs = [e for e in named(evs, "cudaEventSynchronize", "cuda_runtime") if inside(e, flush)]
    assert syncs
    cfg, _ = build_config("reduce-throttle", **SMALL)
    assert not cfg.with_overrides({"reduce_event_throttle": False}).reduce_event_throttle


def test_deferred_reduce_scatter_runs_after_backward(sets: Sets) -> None:
    for name in ("bucket-too-large",):
        t = truth(sets[name])
        for rank in t["ranks"]:
            for step in rank["steps"]:
                rs = step["phases"]["backward"]["collectives"]["reduce_scatter"]
                assert rs["count"] == 0
                assert step["phases"]["optimizer"]["collectives"]["reduce_scatter"]["count"] == 1
        assert t["causes"][0]["rule"] == "reduce-scatter-deferred" and t["causes"][0]["cost_us"] > 0


def test_throughput_timer_syncs_twice_per_step(sets: Sets) -> None:
    evs = events(sets["throughput-timer"])
    timers = frames_named(evs, ": start") + frames_named(evs, ": stop")
    syncs = [e for e in named(evs, "cudaDeviceSynchronize", "cuda_runtime") if inside(e, timers)]
    steps = [e for e in evs if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    assert len(syncs) == 2 * len(steps)


def test_without_prefetch_each_fetch_gathers_only_its_module(sets: Sets) -> None:
    def gathers_per_fetch(evs: list[dict[str, Any]]) -> list[int]:
        ags = [e for e in named(evs, "record_param_comms") if e["args"]["Collective name"] == "_allgather_base"]
        return [sum(inside(a, [f]) for a in ags) for f in frames_named(evs, ": fetch_sub_module")]

    assert max(gathers_per_fetch(events(sets["no-prefetch"]))) == 1
    assert max(gathers_per_fetch(events(sets["healthy"]))) == 2


def test_clock_skew_moves_ts_but_not_the_metrics(sets: Sets) -> None:
    skewed = truth(sets["clock-skew"])
    offsets = skewed["time_base"]["clock_offset_us"]
    assert offsets[0] == 0 and abs(offsets[1]) > 0
    cfg, _ = build_config("clock-skew", **SMALL)
    result, plain = truth_document(cfg.with_overrides({"clock_offset_us": ()}), [])
    for a, b in zip(skewed["ranks"], plain["ranks"], strict=True):
        assert a["span_us"] == pytest.approx(b["span_us"], abs=2e-3)
        assert a["collectives"]["all"]["exposed_us"] == pytest.approx(b["collectives"]["all"]["exposed_us"], abs=5e-3)
        assert a["steps"][0]["start_us"] - b["steps"][0]["start_us"] == pytest.approx(
            offsets[a["rank"] // cfg.gpus_per_node], abs=2e-3
        )
    start = min(e["ts"] for e in gpu(events(sets["clock-skew"], 1)))
    assert start - min(op.start for op in result.ranks[1].gpu) == pytest.approx(TS_ORIGIN_US + offsets[1], abs=1e-2)


def test_torch_version_moves_the_reduce_scatter_stream(tmp_path: Path) -> None:
    generate("healthy", tmp_path / "old", costs=False, torch_version="2.4.0", **SMALL)
    old = events(tmp_path / "old")
    assert {e["tid"] for e in old if is_nccl(e) and "ReduceScatter" in e["name"]} == {25}
    assert {e["tid"] for e in events(Path(tmp_path / "old")) if is_nccl(e) and "AllGather" in e["name"]} == {21}
    assert all(e["name"].endswith("(ncclDevComm*, unsigned long, ncclWork*)") for e in old if is_nccl(e))


def test_nccl_generations_name_kernels(tmp_path: Path) -> None:
    generate("healthy", tmp_path / "v1", costs=False, torch_version="1.13.1", **SMALL)
    evs = events(tmp_path / "v1")
    names = {e["name"] for e in evs if is_nccl(e)}
    assert "ncclKernel_ReduceScatter_RING_LL_Sum___nv_bfloat16(ncclDevComm*, unsigned long, ncclWork*)" in names
    assert all("Collective name" not in e["args"] for e in evs if is_nccl(e))  # copied only from torch 2.2
    comm = named(evs, "record_param_comms")[0]["args"]
    assert "In msg size" in comm and "Process Group ID" in comm


# -- truth consistency -----------------------------------------------------------------------------
def _check_split(split: dict[str, Any]) -> None:
    assert set(split) == set(KINDS)
    assert split["all"]["count"] == sum(split[k]["count"] for k in KINDS if k != "all")
    for s in split.values():
        assert s["exposed_us"] == pytest.approx(s["time_us"] - s["overlapped_us"], abs=1e-3)
        assert -1e-6 <= s["overlapped_us"] <= s["time_us"] + 1e-6
        if s["time_us"] > 0:
            assert s["overlap"] == pytest.approx(s["overlapped_us"] / s["time_us"], abs=1e-6)
        else:
            assert s["overlap"] is None


@pytest.mark.parametrize("name", [n for n in PRESETS if n != "seed-5201"])
def test_truth_is_consistent(sets: Sets, name: str) -> None:
    t = truth(sets[name])
    assert t["schema"] == "overlapcheck.truth/1" and len(t["ranks"]) == 2
    assert set(t["free_comm_us"]) == {"all_gather", "reduce_scatter", "all_reduce"}
    assert all(v > -0.01 * t["step_time_us"] for v in t["free_comm_us"].values())
    for rank in t["ranks"]:
        _check_split(rank["collectives"])
        assert rank["idle_us"] == pytest.approx(rank["span_us"] - rank["busy_us"], abs=1e-3)
        assert rank["compute_us"] <= rank["busy_us"] + 1e-3 <= rank["span_us"] + 2e-3
        # step time: the steps' periods, which follow each other and never add up to more than the span
        steps = rank["steps"]
        assert rank["step_time_us"] == pytest.approx(sum(s["period_us"] for s in steps), abs=1e-3)
        for a, b in zip(steps, steps[1:], strict=False):
            assert b["period_start_us"] == pytest.approx(a["period_start_us"] + a["period_us"], abs=1e-3)
        assert rank["step_time_us"] <= rank["span_us"] + 1e-3
        assert rank["exposed_share"] == pytest.approx(
            sum(s["collectives"]["all"]["exposed_us"] for s in steps) / rank["step_time_us"], rel=1e-6
        )
        assert rank["outside_steps"]["count"] == rank["before_first_step"]["count"] == 0  # all launched in steps
        for copy in (rank["memcpy"], rank["memset"]):
            assert 0 <= copy["exposed_us"] <= copy["time_us"] + 1e-6
        assert rank["memcpy"]["count"] > 0 and rank["memset"]["count"] == len(rank["steps"])
        for step in rank["steps"]:
            _check_split(step["collectives"])
            assert set(step["phases"]) == {"forward", "backward", "optimizer"}
            for kind in KINDS:
                assert step["collectives"][kind]["count"] == sum(
                    p["collectives"][kind]["count"] for p in step["phases"].values()
                )
            assert step["compute_us"] <= step["duration_us"] + 1e-3
        assert sum(s["collectives"]["all"]["count"] for s in rank["steps"]) == rank["collectives"]["all"]["count"]


@pytest.mark.parametrize("name", [n for n in PRESETS if PRESETS[n].causes and n != "seed-5201"])
def test_planted_causes_are_listed_with_a_fix(sets: Sets, name: str) -> None:
    t = truth(sets[name])
    assert sorted(c["rule"] for c in t["causes"]) == sorted(PRESETS[name].causes)  # truth ranks them by cost
    for cause in t["causes"]:
        assert set(cause["fix"]) <= {"config", "env", "upgrade"}
        assert cause["cost_us"] == pytest.approx(t["step_time_us"] - cause["step_time_without_us"], abs=1e-2)


@pytest.mark.parametrize(
    "name", ["bucket-too-large", "no-overlap-comm", "comms-logger", "max-connections-1", "straggler", "offload-sync"]
)
def test_costly_causes_cost_at_least_a_tenth_of_a_step(sets: Sets, name: str) -> None:
    t = truth(sets[name])
    assert t["causes"][0]["cost_us"] > 0.1 * t["causes"][0]["step_time_without_us"]


def test_inherent_deepspeed_syncs_are_measured(sets: Sets) -> None:
    t = truth(sets["healthy"])
    assert [c["rule"] for c in t["inherent"]] != [] and {c["rule"] for c in t["inherent"]} == {
        "epilogue-sync",
        "reduce-event-throttle",
        "fetch-throttle",
    }
    for cause in t["inherent"]:  # the host is ahead of the GPU: these syncs barely cost in this job
        assert abs(cause["cost_us"]) < 0.01 * t["step_time_us"]


def test_engine_collective_ends_when_the_last_rank_started() -> None:
    from overlapcheck.simulate.engine import Collective, Device, run
    from overlapcheck.simulate.host import Host

    devices = {r: Device(r, serialize_all=False) for r in (0, 1)}
    hosts = {r: Host(r, devices[r], 0, 100 + r, 100 + r, 200 + r) for r in (0, 1)}
    coll = Collective("0", 1, "all_gather", 2, transfer_us=50.0)
    ops = {}

    def program(rank: int):
        host = hosts[rank]
        host.t = 0.0 if rank == 0 else 300.0  # rank 1 is late
        ops[rank, "compute"] = host.launch("gemm", 7, 100.0)
        ops[rank, "comm"] = host.launch("nccl", 21, 0.0, cls="comm", coll=coll, communicator="0")
        host.wait_stream(7, 21)
        ops[rank, "after"] = host.launch("gemm", 7, 10.0)
        yield from host.synchronize_stream(7)

    run({r: program(r) for r in (0, 1)}, devices)
    assert ops[0, "comm"].end == ops[1, "comm"].end == ops[1, "comm"].start + 50.0
    assert ops[0, "comm"].start < ops[0, "compute"].end  # ran concurrently with compute on its stream
    assert ops[0, "after"].start == ops[0, "comm"].end  # the wait_stream dependency
    assert hosts[0].t >= ops[0, "after"].end  # the host blocked until the stream drained


def test_interval_helpers() -> None:
    a = merge([(0, 4), (2, 6), (8, 10), (10, 11)])
    assert a == [(0, 6), (8, 11)] and length(a) == 9
    b = merge([(1, 2), (5, 9)])
    assert intersect(a, b) == [(1, 2), (5, 6), (8, 9)]
    assert subtract(a, b) == [(0, 1), (2, 5), (9, 11)]


def test_ds_config_is_written_beside_the_traces(sets: Sets) -> None:
    cfg = json.loads((sets["bucket-too-large"] / "ds_config.json").read_text())
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 1_000_000_000
    assert cfg["_overlapcheck_model"]["parameters"] < 1_000_000_000
    env = json.loads((sets["max-connections-1"] / "ds_config.json").read_text())["_overlapcheck_job"]["env"]
    assert env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


# -- CLI ---------------------------------------------------------------------------------------------
def test_cli_lists_presets() -> None:
    result = CliRunner().invoke(main, ["simulate", "--list"])
    assert result.exit_code == 0
    assert [line.split()[0] for line in result.output.splitlines()] == list(PRESETS)


def test_cli_writes_and_refuses_to_overwrite(tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "set"
    args = [
        "simulate",
        "--scenario",
        "comms-logger+straggler",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--out",
        str(out),
    ]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == [
        "ds_config.json",
        "rank0.trace.json.gz",
        "rank1.trace.json.gz",
        "truth.json",
    ]
    assert [c["rule"] for c in truth(out)["causes"]] == ["comms-logger-sync", "straggler"] or [
        c["rule"] for c in truth(out)["causes"]
    ] == ["straggler", "comms-logger-sync"]
    again = runner.invoke(main, args)
    assert again.exit_code == 2 and "--force" in again.output
    assert runner.invoke(main, [*args, "--force"]).exit_code == 0
    assert not list(out.glob(".*"))  # no temporary files left behind


def test_cli_rejects_unknown_scenario_and_bad_versions(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["simulate", "--scenario", "healthy+nope", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "nope" in result.output
    result = CliRunner().invoke(main, ["simulate", "--torch-version", "latest", "--out", str(tmp_path / "x")])
    assert result.exit_code == 2 and "latest" in result.output
    for empty_part in ("healthy+", "+straggler", "healthy++straggler"):  # were read as healthy / straggler
        result = CliRunner().invoke(main, ["simulate", "--scenario", empty_part, "--out", str(tmp_path / "x")])
        assert result.exit_code == 2 and "empty part" in result.output, empty_part
    assert not (tmp_path / "x").exists()


def test_generate_says_what_it_is_doing(tmp_path):
    lines: list[str] = []
    generate("healthy", tmp_path / "s", nodes=1, gpus_per_node=2, costs=False, progress=lines.append)
    assert lines == ["simulating 2 ranks", "wrote 2 of 2 rank traces"]


def test_without_inherent_costs_only_the_planted_causes_are_simulated_again(sets: Sets, tmp_path: Path) -> None:
    """generate(inherent_costs=False): the same traces and the same cause costs, the other costs left null."""
    full = sets["straggler"]
    t = generate("straggler", tmp_path / "set", inherent_costs=False, **SMALL)
    assert t["causes"] == truth(full)["causes"] and t["causes"][0]["cost_us"] > 0
    assert t["inherent"] and all(c["cost_us"] is None for c in t["inherent"])
    assert t["free_comm_us"] is None
    for f in sorted(full.glob("rank*.trace.json.gz")):
        assert f.read_bytes() == (tmp_path / "set" / f.name).read_bytes(), f.name
