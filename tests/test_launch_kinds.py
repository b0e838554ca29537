"""A collective's kind comes from the op that launched it (trace/launch.py), the kernel name only as a fallback:
on hand-built traces where every kernel is `ncclKernel_SendRecv`, and on the real sub-sampled trace."""

from __future__ import annotations

import json

import pytest
from builders import cpu_op, kernel, launch, run_cli, shared_traces_dir, step, write_trace

from overlapcheck.pipeline import analyze_trace
from overlapcheck.trace.launch import op_collective

SENDRECV = "ncclKernel_SendRecv(ncclWorkElem)"
GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_nn"


@pytest.mark.parametrize(
    ("op", "kind"),
    [
        ("nccl:all_reduce", "all_reduce"),
        ("nccl:_all_gather_base", "all_gather"),
        ("nccl:all_to_all", "all_to_all"),
        ("nccl:_reduce_scatter_base", "reduce_scatter"),
        ("c10d::allreduce_", "all_reduce"),
        ("c10d::_allgather_base_", "all_gather"),
        ("c10d::alltoall_base_", "all_to_all"),
        ("c10d::reduce_scatter_tensor_coalesced_", "reduce_scatter"),
        ("c10d::broadcast_", "broadcast"),
        ("gloo:all_reduce", "all_reduce"),
        ("aten::mm", None),
        ("record_param_comms", None),
    ],
)
def test_op_names_their_collective(op, kind):
    assert op_collective(op) == kind


def test_sendrecv_kernels_take_the_kind_of_their_launching_op(tmp_path):
    events = [
        step(1, 0, 400),
        kernel(GEMM, 0, 50, stream=7),
        # three SendRecv kernels, launched inside all_reduce, all_gather and all_to_all ops
        cpu_op("nccl:all_reduce", 10, 10),
        launch(12, corr=1),
        kernel(SENDRECV, 20, 30, stream=20, corr=1),
        cpu_op("c10d::_allgather_base_", 100, 20),
        cpu_op("nccl:_all_gather_base", 105, 10),  # the innermost op decides
        launch(108, corr=2),
        kernel(SENDRECV, 110, 40, stream=20, corr=2),
        cpu_op("nccl:all_to_all", 200, 10),
        launch(202, corr=3),
        kernel(SENDRECV, 210, 50, stream=20, corr=3),
        # one launched outside any collective op: the kernel name is all there is
        launch(300, corr=4),
        kernel(SENDRECV, 302, 20, stream=20, corr=4),
    ]
    r = analyze_trace(str(write_trace(tmp_path, "rank0.json.gz", events))).metrics
    counts = {k: v.count for k, v in r.collectives.items() if k != "all" and v.count}
    assert counts == {"all_reduce": 1, "all_gather": 1, "all_to_all": 1, "send_recv": 1}
    assert r.collectives["all_to_all"].time_us == 50
    assert r.kind_from == {"launching op": 3, "kernel name": 1}


def test_a_kernels_collective_name_arg_is_the_launching_ops_record(tmp_path):
    events = [
        step(1, 0, 100),
        cpu_op("nccl:all_reduce", 0, 10),  # a wrong enclosing op cannot override the kernel's own record
        launch(2, corr=1),
        kernel("ncclDevKernel_Generic", 5, 30, stream=20, corr=1, **{"Collective name": "_allgather_base"}),
    ]
    r = analyze_trace(str(write_trace(tmp_path, "rank0.json.gz", events))).metrics
    assert r.collectives["all_gather"].count == 1 and r.kind_from == {"launching op": 1}


def test_real_subsampled_trace_names_its_collectives_by_their_ops(tmp_path):
    shared = shared_traces_dir()
    if shared is None or not (shared / "sampled-2rank").is_dir():
        pytest.skip("../shared/traces not present")
    out = tmp_path / "r.json"
    run_cli("analyze", str(shared / "sampled-2rank"), "--format", "json", "-o", str(out))
    doc = json.loads(out.read_text())
    rank0 = next(r for r in doc["ranks"] if r["rank"] == 0)
    times = {k: round(v["time_us"] / 1000) for k, v in rank0["collectives"].items() if k != "all" and v["count"]}
    # every kernel is ncclKernel_SendRecv; the launches sit inside nccl:all_to_all / all_reduce / _all_gather_base
    assert times == {"all_to_all": 182, "all_reduce": 108, "all_gather": 106}
    assert rank0["kind_from"] == {"launching op": 10}
    assert not any("send_recv" in f["title"] for f in doc["findings"])
