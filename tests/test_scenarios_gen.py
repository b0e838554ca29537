"""The round-5 mechanisms of the independent scenario generator (benchmarks/scenarios/gen.py) plant what they say.

Each test generates a small job and reads the raw Kineto events back, so a mechanism that stops planting its
events (or plants them on the wrong stream / group / step) fails here rather than silently turning a scenario
healthy.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

from benchmarks.scenarios.gen import Cfg, write


def _trace(tmp_path: Path, cfg: Cfg, rank: int = 0) -> dict[str, Any]:
    write(cfg, tmp_path, {"zero_optimization": {"stage": 3}}, None)
    with gzip.open(tmp_path / f"rank{rank}.trace.json.gz") as fh:
        doc: dict[str, Any] = json.load(fh)
    return doc


def _nccl(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("nccl")]


SMALL: dict[str, Any] = {"layers": 2, "hidden": 512, "tokens": 1024, "steps": 2}


def test_hpz_backward_gathers_stay_in_the_node(tmp_path: Path) -> None:
    doc = _trace(tmp_path, Cfg(hpz=True, **SMALL), rank=5)
    gathers = [e for e in _nccl(doc) if "AllGather" in e["name"]]
    intra = [e for e in gathers if e["args"]["Process Group Name"] == "3"]
    world = [e for e in gathers if e["args"]["Process Group Name"] == "0"]
    assert intra and world  # backward on node 1's own group, forward on the world
    assert {e["args"]["Group size"] for e in intra} == {4}
    assert {e["args"]["Process Group Ranks"] for e in intra} == {"[4, 5, 6, 7]"}
    assert {e["tid"] for e in intra} == {28}
    names = {p["pg_name"]: p["ranks"] for p in doc["distributedInfo"]["pg_config"]}
    assert names["2"] == [0, 1, 2, 3] and names["3"] == [4, 5, 6, 7]


def test_qwz_gathers_int8_with_scales_and_quantize_kernels(tmp_path: Path) -> None:
    doc = _trace(tmp_path, Cfg(qwz=True, **SMALL))
    dtypes = [e["args"]["dtype"] for e in _nccl(doc) if "AllGather" in e["name"]]
    assert dtypes.count("Char") == dtypes.count("Float") > 0
    kernels = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("tid") == 22]
    assert any("quantization" in k for k in kernels) and any("dequantize" in k for k in kernels)


def test_reduce_scatter_off_all_reduces_the_buckets(tmp_path: Path) -> None:
    kinds = {e["name"].split("_")[1] for e in _nccl(_trace(tmp_path, Cfg(allreduce_grads=True, **SMALL)))}
    assert kinds == {"AllGather", "AllReduce"}


def test_norm_sync_all_reduce_then_item(tmp_path: Path) -> None:
    doc = _trace(tmp_path, Cfg(norm_sync=True, **SMALL))
    ar = [e for e in _nccl(doc) if "AllReduce" in e["name"]]
    assert len(ar) == 2 and {e["tid"] for e in ar} == {7} and {e["args"]["Out msg nelems"] for e in ar} == {1}
    syncs = [e for e in doc["traceEvents"] if e.get("name") == "cudaStreamSynchronize" and e["tid"] == 41000]
    assert len(syncs) == 2 and all(s["ts"] > a["ts"] for s, a in zip(syncs, ar, strict=True))


def test_embedding_gradient_is_the_last_bucket(tmp_path: Path) -> None:
    doc = _trace(tmp_path, Cfg(embed_numel=60_000_000, **SMALL))  # over the 5e7 bucket: it goes alone, last
    rs = [e for e in _nccl(doc) if "ReduceScatter" in e["name"]]
    assert [e["args"]["In msg nelems"] == 60_000_000 for e in rs] == [False, True, False, True]


def test_first_step_without_prefetch_and_step_numbering(tmp_path: Path) -> None:
    cfg = Cfg(step0_no_prefetch=True, step0_lag_us=8000.0, first_step_number=0, layers=4, steps=2)
    doc = _trace(tmp_path, cfg)
    steps = sorted((e["ts"], e["name"]) for e in doc["traceEvents"] if e["name"].startswith("ProfilerStep#"))
    assert [n for _, n in steps] == ["ProfilerStep#0", "ProfilerStep#1"]
    compute = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e.get("tid") == 7]
    gathers = [e for e in _nccl(doc) if "AllGather" in e["name"]]
    step1 = steps[1][0]

    def exposed(step0: bool) -> int:  # gathers that start after the compute stream drained
        n = 0
        for g in gathers:
            if (g["ts"] < step1) != step0:
                continue
            before = [k for k in compute if k["ts"] < g["ts"]]
            if before and max(k["ts"] + k["dur"] for k in before) < g["ts"]:
                n += 1
        return n

    # a prefetching step has 2 (its first gather, the last layer's at the start of backward); step 0 has more
    assert exposed(False) <= 2 and exposed(True) >= exposed(False) + 3


def test_dataloader_stall_only_in_the_steps_named(tmp_path: Path) -> None:
    doc = _trace(tmp_path, Cfg(dataloader_us={0: 20000.0}, **SMALL))
    loads = sorted((e["ts"], e["dur"]) for e in doc["traceEvents"] if "dataloader.py" in e.get("name", ""))
    assert loads[0][1] > 19000 and loads[1][1] < 1000


def test_recompute_reruns_forward_kernels_in_backward(tmp_path: Path) -> None:
    doc = _trace(tmp_path, Cfg(recompute=True, **SMALL))
    ops = [
        e
        for e in doc["traceEvents"]
        if e.get("name") == "autograd::engine::evaluate_function: CheckpointFunctionBackward"
    ]
    assert len(ops) == 4  # 2 layers x 2 steps
    bwd_fwd = [
        e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm" and e["tid"] != 41000
    ]
    assert len(bwd_fwd) == 4 * 4  # 4 forward GEMMs per recomputed layer, on the autograd thread


def test_comms_logger_syncs_the_device_after_every_collective(tmp_path: Path) -> None:
    doc = _trace(tmp_path, Cfg(comms_logger=True, **SMALL))
    syncs = [e for e in doc["traceEvents"] if e.get("name") == "cudaDeviceSynchronize"]
    assert len(syncs) == len(_nccl(doc)) > 0
    frames = {e["name"] for e in doc["traceEvents"] if e.get("cat") == "python_function"}
    assert "deepspeed/comm/comm.py(117): log_wrapper" in frames


def test_offload_optimizer_runs_adam_on_the_host(tmp_path: Path) -> None:
    doc = _trace(tmp_path, Cfg(offload_opt_cpu_adam_us=30000.0, **SMALL))
    events = doc["traceEvents"]
    assert not [e for e in events if e.get("cat") == "kernel" and "AdamFunctor" in e["name"]]
    adam = [e for e in events if e.get("name") == "ds_adam_step"]
    assert len(adam) == 2 and all(e["dur"] > 29000 for e in adam)
    dtoh = [e for e in events if e.get("name") == "Memcpy DtoH (Device -> Pinned)"]
    assert dtoh and {e["tid"] for e in dtoh} == {24}
