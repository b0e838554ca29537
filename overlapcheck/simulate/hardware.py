"""Kernel durations: GEMMs from FLOPs at a fraction of peak, copies from memory bandwidth, collectives
from a ring bandwidth/latency model (NVLink inside a node, InfiniBand across nodes)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Gpu:
    name: str
    device_name: str
    tflops_bf16: float  # dense peak
    hbm_gbps: float
    nvlink_busbw_gbps: float  # NCCL ring bus bandwidth inside a node
    ib_busbw_gbps: float  # per GPU (one NIC per GPU), across nodes
    mem_bytes: int
    sms: int
    compute_major: int
    smem_optin: int
    smem_per_sm: int


GPUS = {
    "A100": Gpu("A100", "NVIDIA A100-SXM4-80GB", 312.0, 1900.0, 230.0, 23.0, 85_196_873_728, 108, 8, 166_912, 167_936),
    "H100": Gpu("H100", "NVIDIA H100 80GB HBM3", 989.0, 3350.0, 360.0, 46.0, 85_018_279_936, 132, 9, 232_448, 233_472),
}

GEMM_EFFICIENCY = 0.55  # achieved fraction of peak for large bf16 GEMMs
NCCL_LATENCY_US = {"intra": 12.0, "inter": 28.0}


def jitter(seed: int, *key: object, spread: float = 0.03) -> float:
    """A deterministic factor in [1 - spread, 1 + spread] for one named thing (order independent)."""
    h = zlib.crc32(repr((seed, *key)).encode())
    return 1.0 + spread * ((h % 20001) / 10000.0 - 1.0)


def gemm_us(gpu: Gpu, m: int, n: int, k: int) -> float:
    """Time of an (m x k) @ (k x n) bf16 GEMM."""
    flops = 2.0 * m * n * k
    return 4.0 + flops / (gpu.tflops_bf16 * 1e12 * GEMM_EFFICIENCY) * 1e6


def attention_us(gpu: Gpu, tokens: int, seq: int, hidden: int, backward: bool = False) -> float:
    """Flash attention (causal): 2 GEMM-like passes over seq x seq per head, half masked."""
    flops = 2.0 * 2.0 * tokens * seq * hidden * 0.5 * (2.5 if backward else 1.0)
    return 6.0 + flops / (gpu.tflops_bf16 * 1e12 * 0.45) * 1e6


def memory_us(gpu: Gpu, nbytes: float) -> float:
    """A bandwidth-bound kernel or device copy moving `nbytes` in total."""
    return 2.0 + nbytes / (gpu.hbm_gbps * 1e9) * 1e6


def host_copy_us(nbytes: float, pinned: bool) -> float:
    """A device-to-host copy over PCIe: pinned ~ 22 GB/s, pageable ~ 6 GB/s (staged)."""
    return 5.0 + nbytes / ((22.0 if pinned else 6.0) * 1e9) * 1e6


BUS_FACTOR = {"all_gather": 1.0, "reduce_scatter": 1.0, "all_reduce": 2.0}


def collective_us(gpu: Gpu, kind: str, total_bytes: float, ranks: int, nodes: int, slowdown: float = 1.0) -> float:
    """Transfer time of a ring collective whose full (gathered / unreduced) buffer is `total_bytes`.

    busbw = algbw * (n-1)/n for all-gather and reduce-scatter, * 2(n-1)/n for all-reduce (nccl-tests
    PERFORMANCE.md); the ring's slowest link is InfiniBand as soon as it leaves the node.
    """
    if ranks <= 1:
        return 3.0
    inter = nodes > 1
    busbw = (gpu.ib_busbw_gbps if inter else gpu.nvlink_busbw_gbps) * 1e9 / slowdown
    moved = total_bytes * BUS_FACTOR[kind] * (ranks - 1) / ranks
    steps = BUS_FACTOR[kind] * (ranks - 1)
    latency = NCCL_LATENCY_US["inter" if inter else "intra"] + 0.8 * steps
    return latency + moved / busbw * 1e6
