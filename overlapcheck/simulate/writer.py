"""Writes one rank's simulated run as a Kineto (torch.profiler `export_chrome_trace`) JSON document.

Key names, argument names, categories, pid/tid conventions and flows copy the real traces in
../shared/traces (nccl_data / benchmark_result / event_sync_trace from HTA's test data, the CPU
ZeRO-3 trace): GPU rows are pid = device, tid = stream; CPU rows pid = process, tid = thread;
`ac2g` flows (`s` on the launching runtime call, `f` with `bp: "e"` on the GPU activity) share the
id of the CUDA correlation.
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
    events: list[dict[str, Any]] = _metadata(cfg, run)
    ev_idx = 0
    for ev in run.cpu:
        ts, dur = run.span(ev.ts, ev.ts + ev.dur)
        args = dict(ev.args)
        if ev.cat != "cuda_runtime":
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
        if ev.flow == "s":
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
        events.extend(_gpu_events(run, op))
    for sync in run.syncs:
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
    events.extend(_gpu_annotations(run))
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


def _gpu_events(run: RankRun, op: GpuOp) -> list[dict[str, Any]]:
    ts, dur = run.span(op.start_time, op.end_time)
    dev = run.local_rank
    if op.kind == "kernel":
        args = {
            "External id": op.ext,
            "queued": 0,
            "device": dev,
            "context": 1,
            "stream": op.stream,
            "correlation": op.corr,
            **op.args,
        }
    else:
        args = {
            "External id": op.ext,
            "device": dev,
            "context": 1,
            "stream": op.stream,
            "correlation": op.corr,
            **op.args,
        }
    return [
        {
            "ph": "X",
            "cat": GPU_CAT[op.kind],
            "name": op.name,
            "pid": dev,
            "tid": op.stream,
            "ts": ts,
            "dur": dur,
            "args": args,
        },
        {"ph": "f", "id": op.corr, "pid": dev, "tid": op.stream, "ts": ts, "cat": "ac2g", "name": "ac2g", "bp": "e"},
    ]


def _gpu_annotations(run: RankRun) -> list[dict[str, Any]]:
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
                    "tid": op.stream,
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
    for stream in sorted({op.stream for op in run.gpu}):
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
