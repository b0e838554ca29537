"""Writes one rank's simulated run as a Kineto (torch.profiler `export_chrome_trace`) JSON document.

Key names, argument names, categories, pid/tid conventions and flows copy the real traces in
../shared/traces (nccl_data / benchmark_result / event_sync_trace from HTA's test data, the CPU
ZeRO-3 trace): GPU rows are pid = device, tid = stream; CPU rows pid = process, tid = thread;
`ac2g` flows (`s` on the launching runtime call, `f` with `bp: "e"` on the GPU activity) share the
id of the CUDA correlation.

The ds013 layout (`SimConfig.layout`) writes the same run as torch 1.13.1's Kineto did (docs/simulator.md,
Layouts; compared with the 2022 trace ../shared/traces/nccl-single-rank/control.json.gz): absolute `ts` and no
`baseTimeNanoseconds`, `async_cpu_to_gpu` flows, `Trace name` / `Profiler Event Index` args, no `cuda_sync` events,
`record_param_comms` without message sizes (torch 1.13 recorded none), `Input Dims` / `Input type` on the
`nccl:*` range instead, no `c10d::_*_base_` dispatcher ops, and the side and NCCL streams numbered as one
stream pool.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path
from typing import Any

from overlapcheck.fsutil import atomic_write
from overlapcheck.simulate.collectives import ProcessGroup
from overlapcheck.simulate.config import SimConfig
from overlapcheck.simulate.engine import GpuOp
from overlapcheck.simulate.hardware import GPUS
from overlapcheck.simulate.model import process_groups
from overlapcheck.simulate.sim import BASE_TIME_NS, RankRun

GPU_CAT = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}

# ds013: torch 1.13 creates the 32 low-priority pool streams of a device at once (c10/cuda/CUDAStream.cpp
# initDeviceStreamState), so DeepSpeed's side streams and the process groups' NCCL streams get ids in sequence
DS013_STREAMS = {13: 13, 17: 14, 21: 15, 25: 16, 29: 17}
# ops torch 1.13 did not have: DeepSpeed's all_gather_into_tensor / reduce_scatter_tensor call the process group
# from Python (distributed_c10d.py), without a c10d:: dispatcher op
DS013_DROPPED = frozenset({"c10d::_allgather_base_", "c10d::_reduce_scatter_base_"})
TORCH_TYPE = {"BFloat16": "c10::BFloat16", "Float": "float"}  # `Input type` spelling of a tensor's dtype
_RECORD_ARGS = ("External id", "Record function id")


def stream_id(cfg: SimConfig, stream: int) -> int:
    """The stream id as this layout writes it."""
    return DS013_STREAMS.get(stream, stream) if cfg.layout == "ds013" else stream


def _ds013_cpu(ev_name: str, args: dict[str, Any], last_comm: dict[int, dict[str, Any]], tid: int) -> dict[str, Any]:
    """A CPU event's args as torch 1.13 wrote them: record_param_comms without sizes; the nccl:* range with its
    input tensor's shape and dtype (`record_shapes=True`), which is the only size such a trace has."""
    if ev_name == "record_param_comms":
        last_comm[tid] = args
        return {k: args[k] for k in _RECORD_ARGS if k in args}
    if ev_name.startswith("nccl:") and tid in last_comm:
        comm = last_comm.pop(tid)
        n = comm.get("In msg nelems", comm.get("In msg size"))
        if isinstance(n, int):
            return {**args, "Input Dims": [[n]], "Input type": [TORCH_TYPE.get(str(comm.get("dtype")), "float")]}
    return args


def device_properties(cfg: SimConfig) -> list[dict[str, Any]]:
    gpu = GPUS[cfg.gpu]
    return [
        {
            "id": i,
            "name": gpu.device_name,
            "totalGlobalMem": gpu.mem_bytes,
            "computeMajor": gpu.compute_major,
            "computeMinor": 0,
            "maxThreadsPerBlock": 1024,
            "maxThreadsPerMultiprocessor": 2048,
            "regsPerBlock": 65536,
            "warpSize": 32,
            "sharedMemPerBlock": 49152,
            "numSms": gpu.sms,
            "regsPerMultiprocessor": 65536,
            "sharedMemPerBlockOptin": gpu.smem_optin,
            "sharedMemPerMultiprocessor": gpu.smem_per_sm,
        }
        for i in range(cfg.gpus_per_node)
    ]


def distributed_info(cfg: SimConfig, rank: int) -> dict[str, Any]:
    """torch/profiler/profiler.py `_get_distributed_info`; pg_config and nccl_version from torch 2.2."""
    info: dict[str, Any] = {"backend": "nccl", "rank": rank, "world_size": cfg.world_size}
    if cfg.torch_at_least("2.2"):
        groups: dict[str, ProcessGroup] = {pg.name: pg for pg in process_groups(cfg)}
        info["pg_count"] = len(groups)
        info["pg_config"] = [groups[name].config_entry() for name in sorted(groups)]
        info["nccl_version"] = cfg.nccl_version
    return info


def trace_document(cfg: SimConfig, run: RankRun) -> dict[str, Any]:
    """The whole JSON document of one rank."""
    ds013 = cfg.layout == "ds013"
    flow_cat = "async_cpu_to_gpu" if ds013 else "ac2g"
    flow_name = "async_gpu" if ds013 else "ac2g"
    launched = {op.corr for op in run.gpu}
    last_comm: dict[int, dict[str, Any]] = {}
    events: list[dict[str, Any]] = _metadata(cfg, run)
    ev_idx = 0
    for ev in run.cpu:
        if ds013 and ev.name in DS013_DROPPED:
            continue
        ts, dur = run.span(ev.ts, ev.ts + ev.dur)
        args = _ds013_cpu(ev.name, dict(ev.args), last_comm, ev.tid) if ds013 else dict(ev.args)
        if ev.cat != "cuda_runtime" and ds013:  # Kineto of 2022 (the real trace nccl-single-rank/control)
            args.pop("Record function id", None)
            args = {"Trace name": "PyTorch Profiler", "Trace iteration": 0, **args, "Profiler Event Index": ev_idx}
            ev_idx += 1
        elif ev.cat != "cuda_runtime":
            args["Ev Idx"] = ev_idx
            ev_idx += 1
        events.append(
            {
                "ph": "X",
                "cat": ev.cat,
                "name": ev.name,
                "pid": run.pid,
                "tid": ev.tid,
                "ts": ts,
                "dur": dur,
                "args": args,
            }
        )
        if ds013 and ev.flow is not None:  # CUPTI flows link launches and copies only (no cuda_sync events)
            if ev.flow == "s" and args["correlation"] in launched:
                events.append(
                    {
                        "ph": "s",
                        "id": args["correlation"],
                        "pid": run.pid,
                        "tid": ev.tid,
                        "ts": ts,
                        "cat": flow_cat,
                        "name": flow_name,
                        "bp": "e",
                    }
                )
        elif ev.flow == "s":
            events.append(
                {
                    "ph": "s",
                    "id": args["correlation"],
                    "pid": run.pid,
                    "tid": ev.tid,
                    "ts": ts,
                    "cat": "ac2g",
                    "name": "ac2g",
                }
            )
        elif ev.flow == "f":
            events.append(
                {
                    "ph": "f",
                    "id": args["correlation"],
                    "pid": run.pid,
                    "tid": ev.tid,
                    "ts": ts,
                    "cat": "ac2g",
                    "name": "ac2g",
                    "bp": "e",
                }
            )
    for op in run.gpu:
        events.extend(_gpu_events(cfg, run, op))
    for sync in [] if ds013 else run.syncs:  # enable_cuda_sync_events came after torch 1.13
        ts, dur = run.span(sync.ts, sync.ts + sync.dur)
        tid = sync.stream if sync.kind in ("Stream Sync", "Stream Wait Event") else -1
        events.append(
            {
                "ph": "X",
                "cat": "cuda_sync",
                "name": sync.kind,
                "pid": run.local_rank,
                "tid": tid,
                "ts": ts,
                "dur": dur,
                "args": {
                    "External id": sync.ext,
                    **sync.args,
                    "correlation": sync.corr,
                    "device": run.local_rank,
                    "context": 1,
                },
            }
        )
        events.append(
            {
                "ph": "f",
                "id": sync.corr,
                "pid": run.local_rank,
                "tid": tid,
                "ts": ts,
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            }
        )
    events.extend(_gpu_annotations(cfg, run))
    start, dur = run.span(run.window[0] - 20.0, run.window[1] + 5.0)
    events.append(
        {
            "ph": "X",
            "cat": "Trace",
            "ts": start,
            "dur": dur,
            "pid": "Spans",
            "tid": "PyTorch Profiler",
            "name": "PyTorch Profiler (0)",
            "args": {"Op count": 0},
        }
    )
    events.append(
        {
            "name": "Iteration Start: PyTorch Profiler",
            "ph": "i",
            "s": "g",
            "pid": "Traces",
            "tid": "Trace PyTorch Profiler",
            "ts": start,
        }
    )
    if ds013:  # Kineto of torch 1.13 writes absolute µs since the epoch (RankRun.epoch_us), no baseTimeNanoseconds
        return {
            "schemaVersion": 1,
            "deviceProperties": device_properties(cfg),
            "distributedInfo": distributed_info(cfg, run.rank),
            "with_stack": 1,
            "host_name": f"node-{run.node}",
            "traceEvents": events,
            "traceName": f"traces/rank{run.rank}.trace.json",
        }
    trace_id = hashlib.sha1(f"{cfg.scenario}/{cfg.seed}/{run.rank}".encode()).hexdigest()[:32].upper()
    doc: dict[str, Any] = {
        "schemaVersion": 1,
        "deviceProperties": device_properties(cfg),
        "distributedInfo": distributed_info(cfg, run.rank),
    }
    if cfg.torch_at_least("2.2"):
        doc.update({"cuda_runtime_version": 12080, "cupti_version": 26, "cuda_driver_version": 12080})
    doc.update(
        {
            "with_stack": 1,
            "trace_id": trace_id,
            "host_name": f"node-{run.node}",
            "traceEvents": events,
            "traceName": f"traces/rank{run.rank}.trace.json",
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": BASE_TIME_NS,
        }
    )
    return doc


def _gpu_events(cfg: SimConfig, run: RankRun, op: GpuOp) -> list[dict[str, Any]]:
    ts, dur = run.span(op.start_time, op.end_time)
    dev = run.local_rank
    stream = stream_id(cfg, op.stream)
    if op.kind == "kernel":
        args = {
            "External id": op.ext,
            "queued": 0,
            "device": dev,
            "context": 1,
            "stream": stream,
            "correlation": op.corr,
            **op.args,
        }
    else:
        args = {
            "External id": op.ext,
            "device": dev,
            "context": 1,
            "stream": stream,
            "correlation": op.corr,
            **op.args,
        }
    ds013 = cfg.layout == "ds013"
    return [
        {
            "ph": "X",
            "cat": GPU_CAT[op.kind],
            "name": op.name,
            "pid": dev,
            "tid": stream,
            "ts": ts,
            "dur": dur,
            "args": args,
        },
        {
            "ph": "f",
            "id": op.corr,
            "pid": dev,
            "tid": stream,
            "ts": ts,
            "cat": "async_cpu_to_gpu" if ds013 else "ac2g",
            "name": "async_gpu" if ds013 else "ac2g",
            "bp": "e",
        },
    ]


def _gpu_annotations(cfg: SimConfig, run: RankRun) -> list[dict[str, Any]]:
    """`gpu_user_annotation` spans: each ProfilerStep on the compute stream, nccl:* on the NCCL rows."""
    out: list[dict[str, Any]] = []
    steps = [ev for ev in run.cpu if ev.cat == "user_annotation" and ev.name.startswith("ProfilerStep#")]
    for ev in steps:
        ops = [op for op in run.gpu if op.stream == 7 and ev.ts <= op.launch_ts <= ev.ts + ev.dur]
        if ops:
            ts, dur = run.span(min(op.start_time for op in ops), max(op.end_time for op in ops))
            out.append(
                {
                    "ph": "X",
                    "cat": "gpu_user_annotation",
                    "name": ev.name,
                    "pid": run.local_rank,
                    "tid": 7,
                    "ts": ts,
                    "dur": dur,
                    "args": {"External id": ev.args["External id"]},
                }
            )
    titles = {
        "all_gather": "nccl:_all_gather_base",
        "reduce_scatter": "nccl:_reduce_scatter_base",
        "all_reduce": "nccl:all_reduce",
    }
    for op in run.gpu:
        if op.cls == "comm":
            if op.collective is None:
                raise ValueError(f"rank {run.rank}: comm op {op.name} has no collective kind")
            ts, dur = run.span(op.start_time, op.end_time)
            out.append(
                {
                    "ph": "X",
                    "cat": "gpu_user_annotation",
                    "name": titles[op.collective],
                    "pid": run.local_rank,
                    "tid": stream_id(cfg, op.stream),
                    "ts": ts,
                    "dur": dur,
                    "args": {"External id": op.ext},
                }
            )
    return out


def _metadata(cfg: SimConfig, run: RankRun) -> list[dict[str, Any]]:
    ts = run.ts(run.window[0] - 10.0)
    out: list[dict[str, Any]] = []

    def meta(name: str, pid: Any, tid: Any, args: dict[str, Any]) -> None:
        out.append({"name": name, "ph": "M", "ts": ts, "pid": pid, "tid": tid, "args": args})

    meta("process_name", run.pid, 0, {"name": "python3"})
    meta("process_labels", run.pid, 0, {"labels": "CPU"})
    meta("process_sort_index", run.pid, 0, {"sort_index": run.pid})
    for dev in range(cfg.gpus_per_node):
        meta("process_name", dev, 0, {"name": "python3"})
        meta("process_labels", dev, 0, {"labels": f"GPU {dev}"})
        meta("process_sort_index", dev, 0, {"sort_index": 16777216 + dev})
    meta("thread_name", run.local_rank, -1, {"name": f"Device {run.local_rank}"})
    for stream in sorted({stream_id(cfg, op.stream) for op in run.gpu}):
        meta("thread_name", run.local_rank, stream, {"name": f"stream {stream} "})
        meta("thread_sort_index", run.local_rank, stream, {"sort_index": stream})
    for tid, label in ((run.main_tid, "pt_main_thread"), (run.autograd_tid, "pt_autograd_0")):
        meta("thread_name", run.pid, tid, {"name": f"thread {tid} ({label})"})
        meta("thread_sort_index", run.pid, tid, {"sort_index": tid})
    meta("process_sort_index", "Spans", 0, {"sort_index": 536870912})
    return out


def write_trace(cfg: SimConfig, run: RankRun, path: Path) -> None:
    raw = json.dumps(trace_document(cfg, run), separators=(",", ":")).encode()
    atomic_write(path, gzip.compress(raw, compresslevel=9, mtime=0), force=True, durable=False)


def write_json(path: Path, doc: Any) -> None:
    atomic_write(path, json.dumps(doc, indent=1) + "\n", force=True, durable=False)
