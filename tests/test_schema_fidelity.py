"""The simulator's traces, field by field, against real torch.profiler traces in ../shared/traces: event key
sets per category, argument names and value types, top-level keys, flows, threads, DeepSpeed frames."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from builders import shared_traces_dir

from overlapcheck.simulate import generate

REAL = {  # file -> what it contributes
    "nccl": "nccl-single-rank/nccl_data.json.gz",  # A100, NCCL 2.17, record_param_comms, pg_config
    "sync": "edge-cases/benchmark_result_493459_1694039959_trace.json.gz",  # cuda_sync events
    "event_sync": "edge-cases/event_sync_trace.json.gz",  # Event Sync / Stream Wait Event
    "zero3": "cpu-zero3-gloo/rank0.cpu_trace_sample.json.gz",  # DeepSpeed 0.19.8 ZeRO-3 stacks
    "h100": "edge-cases/gaunernst_bert-small-uncased__1016001.json.gz",  # H100, python_function
}
# record_param_comms args that differ by torch version (knowledge/zero3-overlap.md §4): "In/Out msg size"
# and "Process Group ID" before kineto #849/#906; "Rank", "Seq", "Is asynchronized op" in newer torch.
VERSIONED_COMM_ARGS = {"In msg size", "Out msg size", "Process Group ID", "Rank", "Seq", "Is asynchronized op"}
# frames that only exist on a GPU job (the real ZeRO-3 trace ran on CPU with gloo)
GPU_ONLY_FRAMES = {
    "deepspeed/accelerator/cuda_accelerator.py(88): synchronize",
    "torch/cuda/__init__.py(1209): synchronize",
}


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path) as f:
        return json.load(f)


def kind(ev: dict[str, Any]) -> tuple[str, str]:
    """A finer category: NCCL kernels, record_param_comms and each cuda_sync kind apart."""
    cat = str(ev.get("cat"))
    if cat == "kernel" and str(ev.get("name", "")).startswith("nccl"):
        cat = "kernel:nccl"
    elif ev.get("name") == "record_param_comms":
        cat = "cpu_op:record_param_comms"
    elif cat == "cuda_sync":
        cat = f"cuda_sync:{ev['name']}"
    return str(ev.get("ph")), cat


def type_name(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    return type(value).__name__


def profile(events: list[dict[str, Any]]) -> tuple[dict, dict]:
    """(kind -> set of key tuples, kind -> arg -> set of value types)."""
    keys: dict[tuple[str, str], set[tuple[str, ...]]] = defaultdict(set)
    args: dict[tuple[str, str], dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for ev in events:
        k = kind(ev)
        keys[k].add(tuple(sorted(ev)))
        for name, value in ev.get("args", {}).items():
            args[k][name].add(type_name(value))
    return keys, args


@pytest.fixture(scope="module")
def real(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    root = shared_traces_dir()
    if root is None or not all((root / p).is_file() for p in REAL.values()):
        pytest.skip("the real traces in ../shared/traces are not available")
    return {name: load(root / path) for name, path in REAL.items()}


@pytest.fixture(scope="module")
def ours(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """A new-torch set (torch 2.13, NCCL 2.27, H100) and an old one (seed-5201: torch 1.13, A100)."""
    root = tmp_path_factory.mktemp("fidelity")
    generate("reduce-throttle+throughput-timer", root / "new", costs=False, nodes=2, gpus_per_node=2)
    generate("seed-5201+offload-sync", root / "old", costs=False, nodes=2, gpus_per_node=2, deepspeed_version="0.13.3")
    return {"new": load(root / "new" / "rank1.trace.json.gz"), "old": load(root / "old" / "rank2.trace.json.gz")}


def all_real_events(real: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [ev for doc in real.values() for ev in doc["traceEvents"]]


@pytest.mark.parametrize("which", ["new", "old"])
def test_event_keys_and_arg_types_match_real_traces(real: dict, ours: dict, which: str) -> None:
    real_keys, real_args = profile(all_real_events(real))
    our_keys, our_args = profile(ours[which]["traceEvents"])
    problems = []
    for k, key_sets in our_keys.items():
        if k not in real_keys:
            problems.append(f"{k}: category not in the real traces")
            continue
        for keys in key_sets - real_keys[k]:
            problems.append(f"{k}: keys {keys} not seen in real traces")
        for arg, types in our_args[k].items():
            if arg not in real_args[k]:
                if not (k[1] == "cpu_op:record_param_comms" and arg in VERSIONED_COMM_ARGS):
                    problems.append(f"{k}: arg {arg!r} not in real traces")
            elif not types <= real_args[k][arg]:
                problems.append(f"{k}: arg {arg!r} types {types} vs real {real_args[k][arg]}")
    assert problems == []


def test_kernel_memcpy_and_sync_args_are_complete(real: dict, ours: dict) -> None:
    _, real_args = profile(all_real_events(real))
    _, our_args = profile(ours["new"]["traceEvents"])
    for k in [
        ("X", "kernel"),
        ("X", "gpu_memcpy"),
        ("X", "gpu_memset"),
        ("X", "cuda_runtime"),
        ("X", "cuda_sync:Stream Wait Event"),
        ("X", "cuda_sync:Stream Sync"),
        ("X", "cuda_sync:Context Sync"),
        ("X", "cuda_sync:Event Sync"),
        ("X", "python_function"),
    ]:
        missing = set(real_args[k]) - set(our_args[k]) - {"Python module id"}
        assert not missing, (k, missing)
    nccl_real = set(real_args[("X", "kernel:nccl")])
    assert nccl_real <= set(our_args[("X", "kernel:nccl")])
    comm_real = set(real_args[("X", "cpu_op:record_param_comms")]) - {"Record function id"}
    assert comm_real <= set(our_args[("X", "cpu_op:record_param_comms")])


def test_top_level_document_matches(real: dict, ours: dict) -> None:
    nccl = real["nccl"]
    for which in ("new", "old"):
        doc = ours[which]
        extra = set(doc) - set().union(*(set(d) for d in real.values()))
        assert not extra, extra
        for key in (
            "schemaVersion",
            "deviceProperties",
            "distributedInfo",
            "traceEvents",
            "traceName",
            "displayTimeUnit",
            "baseTimeNanoseconds",
        ):
            assert type_name(doc[key]) == type_name(nccl[key]), key
        assert set(doc["deviceProperties"][0]) == set(nccl["deviceProperties"][0])
        assert {type_name(v) for v in doc["deviceProperties"][0].values()} == {"number", "str"}
    new_info, real_info = ours["new"]["distributedInfo"], nccl["distributedInfo"]
    assert set(new_info) == set(real_info)
    assert set(new_info["pg_config"][0]) == set(real_info["pg_config"][0])
    assert set(ours["old"]["distributedInfo"]) == {"backend", "rank", "world_size"}  # torch 1.13
    assert [d["name"] for d in ours["new"]["deviceProperties"]][0].startswith("NVIDIA H100")
    assert [d["name"] for d in ours["old"]["deviceProperties"]][0].startswith("NVIDIA A100")


def test_metadata_and_threads(real: dict, ours: dict) -> None:
    real_meta = {ev["name"] for ev in all_real_events(real) if ev.get("ph") == "M"}
    evs = ours["new"]["traceEvents"]
    assert {ev["name"] for ev in evs if ev.get("ph") == "M"} <= real_meta
    names = {
        (ev["pid"], ev["tid"]): ev["args"]["name"] for ev in evs if ev.get("ph") == "M" and ev["name"] == "thread_name"
    }
    streams = {ev["tid"] for ev in evs if ev.get("cat") == "kernel"}
    for stream in streams:
        assert names[(1, stream)] == f"stream {stream} "  # rank 1 is GPU 1 of its node
    step = next(ev for ev in evs if ev.get("name", "").startswith("ProfilerStep#"))
    assert names[(step["pid"], step["tid"])].endswith("(pt_main_thread)")
    backward = [ev for ev in evs if ev.get("name", "").startswith("autograd::engine::evaluate_function")]
    assert backward and {names[(ev["pid"], ev["tid"])] for ev in backward} == {
        f"thread {backward[0]['tid']} (pt_autograd_0)"
    }


def test_flows_link_launches_to_gpu_activity(ours: dict) -> None:
    for doc in ours.values():
        evs = doc["traceEvents"]
        cpu_pid = next(ev["pid"] for ev in evs if ev.get("cat") == "cuda_runtime")
        starts = {ev["id"]: ev for ev in evs if ev.get("ph") == "s"}
        ends = {ev["id"]: ev for ev in evs if ev.get("ph") == "f" and ev["pid"] != cpu_pid}
        dangling = {ev["id"] for ev in evs if ev.get("ph") == "f" and ev["pid"] == cpu_pid}
        gpu = {
            ev["args"]["correlation"]: ev
            for ev in evs
            if ev.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")
        }
        runtime = {ev["args"]["correlation"]: ev for ev in evs if ev.get("cat") == "cuda_runtime"}
        assert set(starts) == set(ends) == set(gpu)
        for corr, ev in gpu.items():
            assert ends[corr]["ts"] == ev["ts"] and ends[corr]["bp"] == "e"
            assert (ends[corr]["pid"], ends[corr]["tid"]) == (ev["pid"], ev["tid"])
            assert starts[corr]["ts"] == runtime[corr]["ts"] and starts[corr]["tid"] == runtime[corr]["tid"]
            assert ev["args"]["External id"] == runtime[corr]["args"].get("External id", ev["args"]["External id"])
        assert {ev["cat"] for ev in evs if ev.get("ph") in ("s", "f")} == {"ac2g"}
        # kineto's flow ends on runtime calls without GPU work (seen in nccl_data for cudaEventRecord etc.)
        assert {runtime[c]["name"] for c in dangling} == {"cudaEventRecord", "cudaEventQuery"}


def test_python_frames_are_real_deepspeed_frames(real: dict, ours: dict) -> None:
    real_names = {ev["name"] for ev in real["zero3"]["traceEvents"] if ev.get("cat") == "python_function"}
    evs = ours["new"]["traceEvents"]
    frames = [ev for ev in evs if ev.get("cat") == "python_function"]
    ours_ds = {ev["name"] for ev in frames if not ev["name"].startswith("train.py")}
    assert ours_ds - real_names <= GPU_ONLY_FRAMES
    by_id = {ev["args"]["Python id"]: ev for ev in frames}
    for ev in frames:
        parent = ev["args"]["Python parent id"]
        if parent is not None:
            p = by_id[parent]
            assert p["tid"] == ev["tid"] and p["ts"] <= ev["ts"] and ev["ts"] + ev["dur"] <= p["ts"] + p["dur"] + 1e-3


def test_nccl_kernel_names_follow_the_real_naming(real: dict, ours: dict) -> None:
    old_style = re.compile(
        r"^ncclKernel_(AllGather|ReduceScatter|AllReduce|Broadcast)_RING_LL_Sum_\w+"
        r"\(ncclDevComm\*, unsigned long, ncclWork\*\)$"
    )
    real_nccl = {ev["name"] for ev in real["nccl"]["traceEvents"] if kind(ev)[1] == "kernel:nccl"}
    assert real_nccl and all(old_style.match(n) for n in real_nccl)
    old = {ev["name"] for ev in ours["old"]["traceEvents"] if kind(ev)[1] == "kernel:nccl"}
    assert old and all(old_style.match(n) for n in old)
    new = {ev["name"] for ev in ours["new"]["traceEvents"] if kind(ev)[1] == "kernel:nccl"}
    assert new and all(re.match(r"^ncclDevKernel_\w+_RING_LL\(ncclDevKernelArgsStorage<4096ul>\)$", n) for n in new)


def test_step_and_comm_annotations(ours: dict) -> None:
    evs = ours["new"]["traceEvents"]
    titles = {ev["name"] for ev in evs if ev.get("cat") == "user_annotation"}
    assert {"nccl:_all_gather_base", "nccl:_reduce_scatter_base", "nccl:all_reduce"} <= titles
    assert {"ProfilerStep#5", "ProfilerStep#6"} <= titles
    ops = {ev["name"] for ev in evs if ev.get("cat") == "cpu_op"}
    assert {"c10d::_allgather_base_", "c10d::_reduce_scatter_base_", "record_param_comms"} <= ops
    runtime = {ev["name"] for ev in evs if ev.get("cat") == "cuda_runtime"}
    assert {
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaEventRecord",
        "cudaStreamWaitEvent",
        "cudaEventSynchronize",
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaMemcpyAsync",
    } <= runtime
