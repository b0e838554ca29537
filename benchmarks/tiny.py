"""Tiny per-rank traces for the scale benchmark (benchmarks/scale.py): a folder of N ranks, ~25 KB each.

Each rank: 4 `ProfilerStep#N`, each a forward (all-gathers, matmuls) and a backward (matmuls, reduce-scatters
on the communication stream, half of them overlapped), a host sync at the step's end; rank-dependent jitter,
and every 97th rank a straggler, so the cross-rank rules have something to look at. Plain JSON, written once
per folder (kept between runs under benchmarks/data/).
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

AG = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
MM = "ampere_sgemm_128x64_tn"
COMPUTE, COMM = 7, 13


def _x(cat: str, name: str, ts: float, dur: float, pid: int, tid: int, **args: Any) -> dict[str, Any]:
    event: dict[str, Any] = {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur}
    if args:
        event["args"] = args
    return event


def rank_trace(rank: int, world: int, steps: int = 4) -> dict[str, Any]:
    """One rank's trace document."""
    rng = random.Random(rank)
    slow = 1.3 if rank % 97 == 5 else 1.0
    events: list[dict[str, Any]] = []
    corr = 1
    t = 1000.0

    def gpu(name: str, start: float, dur: float, stream: int, host: float) -> None:
        nonlocal corr
        events.append(_x("cuda_runtime", "cudaLaunchKernel", host, 3.0, 100, 100, correlation=corr))
        events.append(_x("kernel", name, start, dur, 0, stream, device=0, stream=stream, correlation=corr))
        corr += 1

    for s in range(steps):
        start = t
        host = t + 2.0
        gpu_t = t + 20.0
        for layer in range(3):  # forward: gather the layer's parameters, then compute
            gpu(AG, gpu_t, 40.0 * slow + rng.random() * 5, COMM, host)
            gpu_t += 42.0 * slow
            host += 4.0
            gpu(MM, gpu_t, 60.0 * slow + rng.random() * 3, COMPUTE, host)
            gpu_t += 61.0 * slow
            host += 4.0 + layer
        comm_t = gpu_t
        for _ in range(3):  # backward: compute, reduce-scatter its gradients (half hidden)
            gpu(MM, gpu_t, 80.0 * slow + rng.random() * 3, COMPUTE, host)
            host += 4.0
            gpu(RS, max(comm_t, gpu_t + 40.0), 70.0 + rng.random() * 5, COMM, host)
            comm_t = max(comm_t, gpu_t + 40.0) + 72.0
            gpu_t += 81.0 * slow
            host += 4.0
        end = max(gpu_t, comm_t) + 5.0
        events.append(_x("cuda_runtime", "cudaDeviceSynchronize", host, end - host, 100, 100, correlation=corr))
        corr += 1
        events.append(_x("user_annotation", f"ProfilerStep#{s}", start, end - start + 1.0, 100, 100))
        t = end + 10.0
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}],
        "traceEvents": events,
    }


def tiny_set(ranks: int, root: str | None = None, steps: int = 4) -> str:
    """A folder of `ranks` tiny traces (`rankN.trace.json`) of `steps` profiled steps each, built once."""
    root = root or os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")
    folder = os.path.join(root, f"tiny-{ranks}" if steps == 4 else f"tiny-{ranks}-{steps}steps")
    done = os.path.join(folder, ".complete")
    if os.path.isfile(done):
        return folder
    os.makedirs(folder, exist_ok=True)
    for rank in range(ranks):
        with open(os.path.join(folder, f"rank{rank}.trace.json"), "w") as f:
            json.dump(rank_trace(rank, ranks, steps), f, separators=(",", ":"))
    open(done, "w").close()
    return folder
