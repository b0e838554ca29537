"""fp32-communication and offload-param-copy on hand-built traces (GitHub issue 20, items 2 and 3): each cause with
its cost computed by hand, and its symptom without the cause, which must not fire (docs/rules.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from builders import diagnose_events as diagnose
from builders import findings_by_rule as rules
from builders import frame, kernel, launch, runtime, step

from overlapcheck.analysis.metrics import analyze_model
from overlapcheck.diagnose.facts.hostsyncs import origin_of
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.trace.reader import load_trace

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
RS_F32 = "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RS_BF16 = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
BF16 = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3}}
FETCH = "deepspeed/runtime/zero/partitioned_param_coordinator.py(385): fetch_sub_module"
GATHER = "deepspeed/runtime/zero/partition_parameters.py(1539): all_gather_coalesced"
GATHER_DTYPE = "deepspeed/runtime/zero/partition_parameters.py(1360): _all_gather_dtype"
USER_TO = "train.py(60): <listcomp>"


def args(dtype: str, nelems: int = 1 << 22, name: str = "_reduce_scatter_base") -> dict[str, Any]:
    return {
        "Collective name": name,
        "Process Group Name": "0",
        "In msg nelems": nelems,
        "dtype": dtype,
        "Group size": 2,
    }


def reduction_step(rs: str, rs_dtype: str, ag_dtype: str = "BFloat16", hidden: bool = False) -> list[dict[str, Any]]:
    """ProfilerStep#1 [0, 1000): an all-gather [0, 100) on stream 18 under GEMM A [0, 300); a reduce-scatter
    [300, 500) on stream 17 with nothing beside it (or, `hidden`, under GEMM B [300, 700)); GEMM B otherwise
    [500, 700)."""
    b_start, b_dur = (300, 400) if hidden else (500, 200)
    return [
        step(1, 0, 1000),
        launch(0, 1),
        kernel(GEMM, 0, 300, corr=1),
        launch(1, 2),
        kernel(AG, 0, 100, stream=18, corr=2, **args(ag_dtype, name="_allgather_base")),
        launch(5, 3),
        kernel(rs, 300, 200, stream=17, corr=3, **args(rs_dtype)),
        launch(6, 4),
        kernel(GEMM, b_start, b_dur, corr=4),
    ]


def test_fp32_reductions_under_bf16_cost_half_their_exposed_transfer(tmp_path: Path) -> None:
    # the reduce-scatter is its own best rate (one of its size): 200 µs of transfer, all exposed; in bf16 it takes
    # 100: the finding saves 100 µs per step
    config = {**BF16, "communication_data_type": "fp32"}
    f = rules(diagnose(tmp_path / "cfg", reduction_step(RS_F32, "Float"), config))["fp32-communication"]
    assert f.cost_us == pytest.approx(100.0)
    assert f.fix.config == {"communication_data_type": "bf16"}
    assert f.evidence["training_dtype_from"] == "ds_config bf16.enabled"
    assert f.evidence["communication_data_type"] == "fp32"
    assert f.evidence["fp32_bytes_per_step"] == 4 << 22 and f.evidence["bf16_bytes_per_step"] == 2 << 22
    # without a config the all-gathers' BFloat16 records say the job trains in bf16
    f = rules(diagnose(tmp_path / "none", reduction_step(RS_F32, "Float")))["fp32-communication"]
    assert f.cost_us == pytest.approx(100.0) and f.evidence["training_dtype_from"] == "all-gather records"
    # under fp16 the fix is fp16; DeepSpeed still reads the old `bfloat16` section as bf16
    fp16 = {"fp16": {"enabled": True}, "communication_data_type": "fp32"}
    f = rules(diagnose(tmp_path / "fp16", reduction_step(RS_F32, "Float", "Half"), fp16))["fp32-communication"]
    assert f.fix.config == {"communication_data_type": "fp16"}
    old = {"bfloat16": {"enabled": True}}
    f = rules(diagnose(tmp_path / "old", reduction_step(RS_F32, "Float", "Float"), old))["fp32-communication"]
    assert f.evidence["training_dtype_from"] == "ds_config bfloat16.enabled"
    # the kernel name alone (no dtype record) says f32 too, in NCCL >= 2.19's spelling and the older one
    f = rules(diagnose(tmp_path / "name", reduction_step(RS_F32, "")))["fp32-communication"]
    assert f.cost_us == pytest.approx(100.0)
    older = "ncclKernel_ReduceScatter_RING_LL_Sum_float(ncclWorkElem)"
    f = rules(diagnose(tmp_path / "older", reduction_step(older, ""), config))["fp32-communication"]
    assert f.cost_us == pytest.approx(100.0) and f.evidence["kernel"] == older


@pytest.mark.symptom_without_cause("fp32-communication")
@pytest.mark.parametrize(
    ("case", "rs", "rs_dtype", "ag_dtype", "hidden", "config"),
    [
        ("hidden", RS_F32, "Float", "BFloat16", True, {**BF16, "communication_data_type": "fp32"}),
        ("fp32-training", RS_F32, "Float", "Float", False, {"bf16": {"enabled": False}}),
        ("fp32-training-no-config", RS_F32, "Float", "Float", False, None),
        ("bf16-kernels", RS_BF16, "BFloat16", "BFloat16", False, BF16),
    ],
)
def test_fp32_reductions_without_the_cause_are_no_finding(
    tmp_path: Path, case: str, rs: str, rs_dtype: str, ag_dtype: str, hidden: bool, config: dict[str, Any] | None
) -> None:
    # fp32 communication that compute hides costs nothing (nothing above info); under fp32 training fp32 is the
    # right dtype; exposed bf16 kernels (GEMM B waits for them: a cross-stream wait) are not this cause
    report = diagnose(tmp_path, reduction_step(rs, rs_dtype, ag_dtype, hidden), config)
    assert "fp32-communication" not in rules(report)
    if hidden:
        assert [f.rule for f in report.findings if f.severity != "info"] == []


def framed(frames: list[str], start: float, end: float) -> list[dict[str, Any]]:
    """`frames` (outermost first) nested around a call [start, end)."""
    return [frame(name, start - 5 + i, end - start + 10 - 2 * i) for i, name in enumerate(frames)]


def copy(name: str, ts: float, dur: float, corr: int, nbytes: int, stream: int = 18) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "gpu_memcpy",
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"device": 0, "stream": stream, "correlation": corr, "bytes": nbytes},
    }


def gather_step(frames: list[str], pinned: bool = False) -> list[dict[str, Any]]:
    """GEMM A [0, 100); inside `frames` the host copies a shard to the GPU with cudaMemcpyAsync: pageable, the call
    [110, 360) returns once its copy [115, 355) on stream 18 is done; pinned, it returns at 115 and the copy runs
    [115, 180). The all-gather is launched when the call returns and runs for 100 µs on stream 18; GEMM B is
    launched 10 µs after the call returns and starts 5 µs later: pageable, the compute stream starves [100, 375)."""
    ret = 115.0 if pinned else 360.0
    name = f"Memcpy HtoD ({'Pinned' if pinned else 'Pageable'} -> Device)"
    copy_end = 180.0 if pinned else 355.0
    return [
        step(1, 0, 1000),
        launch(0, 1),
        kernel(GEMM, 0, 100, corr=1),
        *framed(frames, 110, ret),
        runtime("cudaMemcpyAsync", 110, ret - 110, 2),
        copy(name, 115, copy_end - 115, 2, 1_440_000),
        launch(ret + 1, 3),
        kernel(AG, max(ret + 5, copy_end), 100, stream=18, corr=3, **args("BFloat16", name="_allgather_base")),
        launch(ret + 10, 4),
        kernel(GEMM, ret + 15, 300, corr=4),
    ]


def origins(folder: Path) -> list[tuple[str, bool]]:
    model = load_trace(str(folder / "rank0.trace.json.gz"))
    return [(origin_of(s), s.waited) for s in RankFacts(model, analyze_model(model)).host_syncs.syncs]


def test_pageable_parameter_copy_in_all_gather_coalesced_is_offload_param_copy(tmp_path: Path) -> None:
    config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": False}}}
    report = diagnose(tmp_path / "offload", gather_step([FETCH, GATHER, GATHER_DTYPE]), config)
    assert origins(tmp_path / "offload") == [("param-offload-copy", True)]
    f = rules(report)["offload-param-copy"]
    assert f.fix.config == {"zero_optimization.offload_param.pin_memory": True}
    assert f.evidence["call_site"] == GATHER_DTYPE and f.evidence["awaited"] == {"memcpy": 1}
    assert "host-sync" not in rules(report)
    # the same blocking copy in user code (`batch.to(device)` from pageable memory) is a generic host sync, with
    # the same cost; the offload finding charges that less what the copy would still take pinned: its 240 µs at
    # the default pinned/pageable bandwidth ratio (22/6), the trace having no pinned copy to measure one
    user = rules(diagnose(tmp_path / "user", gather_step([USER_TO])))
    assert "offload-param-copy" not in user
    assert f.cost_us == pytest.approx(user["host-sync"].cost_us - 240.0 * 6.0 / 22.0, abs=1e-3)
    assert user["host-sync"].cost_us > 240.0 * 6.0 / 22.0


@pytest.mark.symptom_without_cause("offload-param-copy")
def test_pinned_parameter_copy_that_returns_at_once_is_no_finding(tmp_path: Path) -> None:
    # a pinned shard's cudaMemcpyAsync returns before its copy ends (CUDA: asynchronous with pinned memory), the
    # copy overlaps GEMM B: no sync, nothing above info
    config = {"zero_optimization": {"stage": 3, "offload_param": {"device": "cpu", "pin_memory": True}}}
    report = diagnose(tmp_path, gather_step([FETCH, GATHER, GATHER_DTYPE], pinned=True), config)
    assert origins(tmp_path) == [("param-offload-copy", False)]  # its frames matched; it waited for nothing
    assert "offload-param-copy" not in rules(report)
    assert [f.rule for f in report.findings if f.severity != "info"] == []


# -- small-reductions (issue 20 item 5) -----------------------------------------------------------------------

SMALL_ELEMS = 1 << 19  # 1 MiB in bf16
LARGE_ELEMS = 1 << 24  # 32 MiB


def small_reductions_step(small_us: float = 50.0, hidden: bool = False) -> list[dict[str, Any]]:
    """ProfilerStep#1 [0, 10000): a 32 MiB reduce-scatter [100, 500) under GEMM A [0, 1000) (84 GB/s); 16
    reduce-scatters of 1 MiB back to back on stream 17 from 1000, `small_us` each, with nothing beside them (or,
    `hidden`, under GEMM B [1000, 2000)); GEMM B otherwise [2000, 2500)."""
    events = [step(1, 0, 10000), launch(0, 1), kernel(GEMM, 0, 1000, corr=1), launch(1, 2)]
    events.append(kernel(RS_BF16, 100, 400, stream=17, corr=2, **args("BFloat16", LARGE_ELEMS)))
    for i in range(16):
        events += [
            launch(2 + i, 10 + i),
            kernel(RS_BF16, 1000 + i * small_us, small_us, stream=17, corr=10 + i, **args("BFloat16", SMALL_ELEMS)),
        ]
    b = (1000, 1000) if hidden else (2000, 500)
    return [*events, launch(30, 40), kernel(GEMM, b[0], b[1], corr=40)]


SMALL_BUCKETS = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "reduce_bucket_size": 100_000}}


def test_latency_bound_reductions_cost_their_time_beyond_the_large_ones_rate(tmp_path: Path) -> None:
    # the large one moves 32 MiB in 400 µs (83.9 bytes/µs); a 1 MiB one would take 12.5 µs at that rate and takes
    # 50 (25 %): 37.5 µs each of latency, all exposed, 16 per step; the parameters are the step's reduce-scatter
    # elements (25.2M): a quarter, to two significant digits, is the suggested bucket
    f = rules(diagnose(tmp_path, small_reductions_step(), SMALL_BUCKETS))["small-reductions"]
    assert f.cost_us == pytest.approx(16 * (50.0 - (2 * SMALL_ELEMS) / (2 * LARGE_ELEMS / 400.0)))
    assert f.fix.config == {"zero_optimization.reduce_bucket_size": 6_300_000}
    assert f.evidence["latency_bound_per_step"] == 16 and f.evidence["median_bytes"] == 2 * SMALL_ELEMS


@pytest.mark.symptom_without_cause("small-reductions")
@pytest.mark.parametrize(
    ("case", "small_us", "hidden", "bucket"),
    [("hidden", 50.0, True, 100_000), ("same-rate", 14.0, False, 100_000), ("large-bucket", 50.0, False, 6_300_000)],
)
def test_small_reductions_without_the_cause_are_no_finding(
    tmp_path: Path, case: str, small_us: float, hidden: bool, bucket: int
) -> None:
    # hidden under compute they cost nothing (nothing above info); at 14 µs they run at 89 % of the large ones'
    # rate: small, not latency-bound; with the suggested bucket already set, the bucket is not what keeps them small
    config = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "reduce_bucket_size": bucket}}
    report = diagnose(tmp_path, small_reductions_step(small_us, hidden), config)
    assert "small-reductions" not in rules(report)
    if hidden:
        assert [f.rule for f in report.findings if f.severity != "info"] == []


# ---------------------------------------------------------------------------------------- gradient-allreduce
AR_BF16 = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AVG_SCATTER = "deepspeed/runtime/zero/stage3.py(1863): __avg_scatter_contiguous_grads"
REDUCE_IPG = "deepspeed/runtime/zero/stage3.py(1570): __reduce_and_partition_ipg_grads"
RS_OFF = {**BF16, "zero_optimization": {"stage": 3, "reduce_scatter": False}}


def allreduce_step(nelems: int = 1 << 22, hidden: bool = False, frames: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """reduction_step with the gradient bucket all-reduced (bf16, `nelems` elements: 8 MiB by default) [300, 500)
    on stream 17, launched at 5 (inside `frames`, outermost first, when given)."""
    events = reduction_step(RS_BF16, "BFloat16", hidden=hidden)
    for e in events:
        if e.get("name") == RS_BF16:
            e["name"] = AR_BF16
            e["args"]["Collective name"] = "allreduce"
            e["args"]["In msg nelems"] = nelems
    return events + framed(list(frames), 5, 6)


def test_gradients_all_reduced_with_reduce_scatter_off_cost_half_their_exposed_transfer(tmp_path: Path) -> None:
    # the 200 µs all-reduce is its own best rate, all exposed; a reduce-scatter of the same bucket moves half the
    # bytes: 100 µs per step saved
    f = rules(diagnose(tmp_path / "cfg", allreduce_step(), RS_OFF))["gradient-allreduce"]
    assert f.cost_us == pytest.approx(100.0)
    assert f.fix.config == {"zero_optimization.reduce_scatter": True}
    assert f.evidence["evidence_from"] == "ds_config" and f.evidence["reduce_scatter"] is False
    assert f.evidence["all_reduce_bytes_per_step"] == 2 << 22 and f.evidence["exposed_us_per_step"] == 200.0
    # without the setting in the config, DeepSpeed's reduce path in the stack says the same
    f = rules(diagnose(tmp_path / "stack", allreduce_step(frames=(REDUCE_IPG, AVG_SCATTER)), BF16))[
        "gradient-allreduce"
    ]
    assert f.cost_us == pytest.approx(100.0) and f.evidence["evidence_from"] == "call site"
    f = rules(diagnose(tmp_path / "nocfg", allreduce_step(frames=(AVG_SCATTER,))))["gradient-allreduce"]
    assert f.cost_us == pytest.approx(100.0)


@pytest.mark.symptom_without_cause("gradient-allreduce")
@pytest.mark.parametrize(
    ("case", "nelems", "hidden", "frames", "config"),
    [
        ("hidden", 1 << 22, True, (), RS_OFF),  # the all-reduce is under compute: halving it saves nothing
        ("no-reduce-path", 1 << 22, False, ("train.py(80): allreduce_grads",), BF16),  # the user's own all-reduce
        ("reduce-scatter-on", 1 << 22, False, (AVG_SCATTER,), {**BF16, "zero_optimization": {"reduce_scatter": True}}),
        ("gradient-norm", 64, False, (), RS_OFF),  # a scalar all-reduce, not a gradient bucket
    ],
)
def test_all_reduces_without_the_cause_are_no_gradient_allreduce(
    tmp_path: Path, case: str, nelems: int, hidden: bool, frames: tuple[str, ...], config: dict[str, Any]
) -> None:
    report = diagnose(tmp_path, allreduce_step(nelems, hidden, frames), config)
    assert "gradient-allreduce" not in rules(report)
    if hidden:
        assert [f.rule for f in report.findings if f.severity != "info"] == []
