"""The ds013 layout (GitHub issue 25): traces as DeepSpeed 0.13.3 + torch 1.13.1 + NCCL 2.14 wrote them, read back
with the sizes the stack left (the nccl:* ops' Input Dims, else the gradient copies), and the fixes that fit the
job's DeepSpeed. Generated at 2 nodes x 4 GPUs; docs/simulator.md, "Layouts"."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from builders import SimulatedSets

from overlapcheck.diagnose import _drop_applied
from overlapcheck.job import JobContext
from overlapcheck.model import Finding, Fix
from overlapcheck.pipeline import analyze
from overlapcheck.trace import classify as C
from overlapcheck.trace.model import SHAPES_NOTE

SIZE: dict[str, Any] = {"nodes": 2, "gpus_per_node": 4}
Event = dict[str, Any]


@pytest.fixture
def seed(simulated: SimulatedSets) -> Path:
    """test_diagnose_presets.py's ds013 set at 2x4, simulated once per session; these tests read the planted causes'
    costs, the config and the bandwidth of its truth, never the inherent costs or free_comm_us (not simulated)."""
    return simulated.folder("seed-5201", layout="ds013", inherent_costs=False, **SIZE)


def document(folder: Path, rank: int = 0) -> dict[str, Any]:
    with gzip.open(folder / f"rank{rank}.trace.json.gz") as f:
        return json.load(f)


def truth(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "truth.json").read_text())


def test_layout_sets_the_stack_versions_and_keeps_the_model_size_out(seed: Path) -> None:
    config = truth(seed)["config"]
    assert (config["layout"], config["torch_version"], config["deepspeed_version"], config["nccl_version"]) == (
        "ds013",
        "1.13.1",
        "0.13.3",
        "2.14.3",
    )
    ds_config = json.loads((seed / "ds_config.json").read_text())
    assert "_overlapcheck_model" not in ds_config  # the user's traces came with the DeepSpeed config alone
    assert ds_config["_overlapcheck_job"]["deepspeed"] == "0.13.3"
    assert "timers" not in ds_config  # no timers.throughput before DeepSpeed 0.14.3


def test_torch_113_schema(seed: Path) -> None:
    doc = document(seed)
    assert "baseTimeNanoseconds" not in doc and "trace_id" not in doc
    assert doc["distributedInfo"] == {"backend": "nccl", "rank": 0, "world_size": 8}  # no pg_config, nccl_version
    evs = doc["traceEvents"]
    timed = [e["ts"] for e in evs if "ts" in e]
    assert min(timed) > 1e15  # absolute µs since the epoch
    assert not [e for e in evs if e.get("cat") == "cuda_sync"]  # enable_cuda_sync_events came later
    flows = {(e["cat"], e["name"]) for e in evs if e.get("ph") in ("s", "f")}
    assert flows == {("async_cpu_to_gpu", "async_gpu")}
    assert not [e for e in evs if e.get("name", "").startswith("c10d::_")]  # no c10d dispatcher ops for _base


def test_nccl_214_kernels_and_sizes_only_in_input_dims(seed: Path) -> None:
    evs = document(seed)["traceEvents"]
    nccl = {e["name"] for e in evs if e.get("cat") == "kernel" and e["name"].startswith("nccl")}
    assert nccl == {
        "ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclKernel_ReduceScatter_RING_LL_Sum___nv_bfloat16(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
    }
    comms = [e for e in evs if e.get("name") == "record_param_comms"]
    assert comms and all(
        set(e["args"]) <= {"External id", "Trace name", "Trace iteration", "Profiler Event Index"} for e in comms
    )
    ranges = [e for e in evs if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:")]
    assert ranges and all(
        isinstance(e["args"]["Input Dims"][0][0], int) and e["args"]["Input type"][0] in ("c10::BFloat16", "float")
        for e in ranges
    )
    rs = [e for e in ranges if e["name"] == "nccl:_reduce_scatter_base"]
    params = truth(seed)["config"]["model"]["parameters"]
    assert sum(e["args"]["Input Dims"][0][0] for e in rs) == params * 2  # the whole gradient buffer, 2 steps


def test_streams_of_one_pool_and_torch_113_frames(seed: Path) -> None:
    evs = document(seed)["traceEvents"]
    streams = {e["args"]["stream"] for e in evs if e.get("cat") == "kernel"}
    assert streams == {7, 13, 14, 15, 16}
    frames = {e["name"] for e in evs if e.get("cat") == "python_function"}
    assert "torch/autograd/grad_mode.py(27): decorate_context" in frames
    assert "deepspeed/runtime/zero/stage3.py(1249): __reduce_and_partition_ipg_grads" in frames
    assert "deepspeed/runtime/zero/stage3.py(1213): reduce_independent_p_g_buckets_and_remove_grads" in frames
    assert not [f for f in frames if "_contextlib" in f or "_fetch_sub_module_impl" in f or "graph.py" in f]


def test_both_nccl_214_spellings_are_read_as_their_collective() -> None:
    # the source's names (the bf16 type token is __nv_bfloat16) and the shorter spelling
    for name, kind in (
        (
            "ncclKernel_ReduceScatter_RING_LL_Sum___nv_bfloat16(ncclDevComm*, unsigned long, ncclWork*)",
            "reduce_scatter",
        ),
        ("ncclKernel_ReduceScatter_RING_LL_Sum_bf16(ncclWorkElem)", "reduce_scatter"),
        ("ncclKernel_AllGather_RING_LL_Sum_int8_t(ncclWorkElem)", "all_gather"),
    ):
        assert C.is_comm_kernel(name)
        assert C.collective_of(name, None) == kind


def deferral(report: Any) -> Finding:
    return next(f for f in report.findings if f.rule == "reduce-scatter-deferred")


def test_sizes_come_from_input_dims_and_the_deferral_is_costed(seed: Path) -> None:
    report = analyze(seed, jobs=1)
    planted = truth(seed)["causes"][0]
    assert planted["rule"] == "reduce-scatter-deferred"
    first = report.findings[0]
    assert first.rule == "reduce-scatter-deferred"
    assert first.evidence["sizes_from"] == "Input Dims"
    assert first.evidence["parameters"] == truth(seed)["config"]["model"]["parameters"]
    assert abs(first.cost_us / planted["cost_us"] - 1) < 0.15
    assert any(n.startswith(SHAPES_NOTE) for r in report.ranks for n in r.notes)
    # an all-gather known by its input shard counts its whole output (shard x group), as nccl-tests sizes it
    moved = truth(seed)["bandwidth"]["all_gather"]["bytes_per_step"]
    assert report.bandwidth is not None
    assert report.bandwidth.kinds["all_gather"].bytes_per_step == pytest.approx(moved)


def strip(seed: Path, out: Path, keys: tuple[str, ...]) -> Path:
    """A copy of the set without these args on any event."""
    shutil.copytree(seed, out)
    for path in out.glob("rank*.trace.json.gz"):
        doc = json.loads(gzip.decompress(path.read_bytes()))
        for e in doc["traceEvents"]:
            for key in keys:
                e.get("args", {}).pop(key, None)
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
    return out


def test_without_shapes_the_deferral_is_costed_from_the_gradient_copies(seed: Path, tmp_path: Path) -> None:
    """record_shapes off: no size anywhere but the bucket copies; the cost is what was measured less the last
    bucket at the best rate, never 0 beside a '100 % exposed' text."""
    out = strip(seed, tmp_path / "no-shapes", ("Input Dims", "Input type"))
    report = analyze(out, jobs=1)
    planted = truth(seed)["causes"][0]
    first = report.findings[0]
    assert first.rule == "reduce-scatter-deferred"
    assert first.fix.config == {"zero_optimization.reduce_bucket_size": 50_000_000}
    ev = first.evidence
    assert (ev["parameters_from"], ev["volume_from"]) == ("unknown", "gradient copies")
    assert ev["reduce_scatter_bytes_per_step"] == truth(seed)["config"]["model"]["parameters"] * 2
    assert 0 < ev["inherent_us_per_step"] < ev["deferred_exposed_us_per_step"]
    assert ev["best_rate_gbps"] > 0
    assert abs(first.cost_us / planted["cost_us"] - 1) < 0.15


def test_without_any_size_the_whole_exposed_time_is_the_cost(seed: Path, tmp_path: Path) -> None:
    """No shapes and no copy sizes either: the last bucket is unknown; an upper bound, said so, never 0."""
    out = strip(seed, tmp_path / "no-sizes", ("Input Dims", "Input type", "bytes"))
    first = analyze(out, jobs=1).findings[0]
    assert first.rule == "reduce-scatter-deferred"
    assert (first.evidence["volume_from"], first.evidence["inherent_us_per_step"]) == ("none", 0.0)
    assert first.cost_us >= truth(seed)["causes"][0]["cost_us"]
    assert "upper bound" in first.why and "100% exposed" in first.why


def _timer(fix: Fix) -> Finding:
    return Finding("throughput-timer-sync", "info", "t", "why", 1.0, [0], [5], {}, fix)


TIMER_FIX = Fix(config={"timers.throughput.synchronized": False}, upgrade="deepspeed>=0.14.3")


@pytest.mark.parametrize("version", ["0.13.3", None])
def test_a_fix_names_no_key_the_version_lacks(version: str | None) -> None:
    """Known older than 0.14.3, or unknown while the fix itself asks for 0.14.3: the upgrade alone, with the key
    to set once upgraded in the reason."""
    f = _drop_applied(_timer(TIMER_FIX), JobContext(deepspeed_version=version))
    assert f.fix == Fix(upgrade="deepspeed>=0.14.3")
    assert "timers.throughput.synchronized: false" in f.why and "0.14.3" in f.why


def test_a_version_with_the_key_keeps_it_and_needs_no_upgrade() -> None:
    f = _drop_applied(_timer(TIMER_FIX), JobContext(deepspeed_version="0.19.8"))
    assert f.fix == Fix(config={"timers.throughput.synchronized": False})
    assert f.why == "why"


CONTROL = Path(__file__).resolve().parents[2] / "shared" / "traces" / "nccl-single-rank" / "control.json.gz"


@pytest.mark.skipif(not CONTROL.is_file(), reason="../shared/traces absent")
def test_the_layout_matches_a_real_2022_kineto_trace(seed: Path) -> None:
    """HTA's trace_diff/control (August 2022, the Kineto generation torch 1.13 shipped): the same top-level keys,
    flow names, record_param_comms without sizes and the nccl:* range's shape args."""
    real, ours = json.loads(gzip.decompress(CONTROL.read_bytes())), document(seed)
    assert set(real) - {"deviceProperties"} <= set(ours) - {"with_stack", "host_name", "traceName"}
    assert set(real["distributedInfo"]) == set(ours["distributedInfo"])

    def shape(doc: dict[str, Any]) -> tuple[set, set, set]:
        """(flow cat/name pairs, record_param_comms arg keys, nccl:* user_annotation arg keys)"""
        evs = doc["traceEvents"]
        flows = {(e["cat"], e["name"]) for e in evs if e.get("ph") in ("s", "f")}
        comms = {k for e in evs if e.get("name") == "record_param_comms" for k in e["args"]}
        nccl = [e for e in evs if e.get("cat") == "user_annotation" and e.get("name", "").startswith("nccl:")]
        return flows, comms, {k for e in nccl for k in e["args"]}

    (real_flows, real_comms, real_ranges), (flows, comms, ranges) = shape(real), shape(ours)
    assert flows == real_flows
    assert comms <= real_comms  # no message sizes in either
    assert {"Input Dims", "Input type"} <= ranges & real_ranges
