"""host-bound-launch, small-reductions' latency-bandwidth reference and tiny-collectives' buffer sizes on
hand-built traces: each cause with its cost by hand, and its symptom without the cause (docs/rules.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from builders import diagnose_events as diagnose
from builders import findings_by_rule as rules
from builders import frame, kernel, launch, runtime, step

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
LOG = "train.py(40): log_metrics"


def rs_args(nelems: int = 1 << 22, pg: str = "1") -> dict[str, Any]:
    return {
        "Collective name": "_reduce_scatter_base",
        "Process Group Name": pg,
        "In msg nelems": nelems,
        "dtype": "BFloat16",
    }


# -- host-bound-launch ----------------------------------------------------------------------------------------


def starved_step(mode: str) -> list[dict[str, Any]]:
    """ProfilerStep#1 [0, 3000): five times, a GEMM [t + 5, t + 105) and a reduce-scatter [t + 105, t + 305) on
    stream 17 after it, with no compute beside it, then a last GEMM. `mode`:

    - "host": the host launches GEMM i at t = 500 i, 395 µs after the previous one ended, spending the gap in
      `train.py(40): log_metrics`: the GPU waits for the CPU, the reduce-scatters run in those gaps;
    - "sync": the host blocks in cudaStreamSynchronize until each reduce-scatter ends and launches the next GEMM
      4 µs later (t = 310 i): the host waited for its GPU, it was not slow;
    - "ahead": every launch is issued at the start; each GEMM waits for the reduce-scatter before it (a stream
      wait, t = 300 i): the host is ahead;
    - "sampled": the "host" timeline in a trace that lost events: the correlation ids of the calls it records
      skip 1000 at a time (a sub-sampled trace), so the gaps may be launches it does not hold."""
    period = {"host": 500, "sync": 310, "ahead": 300, "sampled": 500}[mode]
    stride = 1000 if mode == "sampled" else 1
    events = [step(1, 0, 3000)]
    corr = 1
    for i in range(6):
        t = period * i
        at = (2 * i if mode == "ahead" else t, 2 * i + 1 if mode == "ahead" else t + 1)
        start = t + 5 if mode != "ahead" else max(5, t + 5)
        events += [launch(at[0], corr), kernel(GEMM, start, 100, corr=corr)]
        corr += stride
        if i == 5:
            break
        events += [launch(at[1], corr), kernel(RS, start + 100, 200, stream=17, corr=corr, **rs_args())]
        corr += stride
        if mode in ("host", "sampled"):
            events.append(frame(LOG, t + 110, 380))
        if mode == "sync":
            events.append(runtime("cudaStreamSynchronize", t + 2, start + 300 - (t + 2) + 1, corr + 100))
    return events


def test_host_bound_launch_costs_the_communication_exposed_while_the_gpu_waits_for_the_host(tmp_path: Path) -> None:
    # five reduce-scatters of 200 µs, each inside a gap the host left (the next GEMM launched 395 µs after the
    # previous one ended): 1000 µs per step of exposed communication is the host's pace; no config fix
    report = diagnose(tmp_path, starved_step("host"))
    found = rules(report)
    f = found["host-bound-launch"]
    assert f.cost_us == pytest.approx(1000.0)
    assert f.evidence["starved_windows_per_step"] == 5
    assert f.evidence["starved_compute_idle_us_per_step"] == pytest.approx(5 * 395.0)
    assert "log_metrics" in f.evidence["host_frames_us_per_step"][0]["frame"]
    assert f.fix.config is None and f.fix.env is None
    assert "unexplained-exposure" not in found  # it explains that exposure
    assert report.findings_explain_share == pytest.approx(1.0)


@pytest.mark.symptom_without_cause("host-bound-launch")
@pytest.mark.parametrize("mode", ["sync", "ahead", "sampled"])
def test_gaps_the_host_did_not_cause_are_not_host_bound(tmp_path: Path, mode: str) -> None:
    # the same exposed reduce-scatters with compute idle beside them, but the host waited in a sync (host-sync's)
    # or was ahead and compute waited for a stream (a stall): not the host's pace; or the trace lost the events
    # of the gaps: they do not show what the host did
    found = rules(diagnose(tmp_path, starved_step(mode)))
    assert "host-bound-launch" not in found
    if mode == "sync":
        assert "host-sync" in found


# -- small-reductions without a large reduce-scatter to compare with ----------------------------------------

ALPHA_US = 40.0
RATE = (1 << 21) / 40.0  # bytes per µs: 2 MiB in 40 µs
SIZES = [1 << 17, 1 << 18, 1 << 19, 1 << 20]  # bf16 elements: 0.25 .. 2 MiB
SMALL_BUCKETS = {"bf16": {"enabled": True}, "zero_optimization": {"stage": 3, "reduce_bucket_size": 100_000}}


def small_sizes_step(alpha_us: float) -> list[dict[str, Any]]:
    """ProfilerStep#1 [0, 10000): GEMM A [0, 1000); six reduce-scatters of each of 0.25, 0.5, 1 and 2 MiB back
    to back on stream 17 from 1000, each `alpha_us` + bytes / RATE, all issued at once (the host far ahead), with
    nothing beside them; GEMM B after them. No reduce-scatter of 16 MiB or more."""
    events = [step(1, 0, 10000), launch(0, 1), kernel(GEMM, 0, 1000, corr=1)]
    t, corr = 1000.0, 2
    for _ in range(6):
        for n in SIZES:
            dur = alpha_us + 2 * n / RATE
            events += [launch(corr, corr), kernel(RS, t, dur, stream=17, corr=corr, **rs_args(n))]
            t += dur
            corr += 1
    return [*events, launch(corr, corr), kernel(GEMM, t + 10, 500, corr=corr)]


def test_small_reductions_take_their_reference_from_a_latency_bandwidth_fit(tmp_path: Path) -> None:
    # t = 40 µs + bytes / RATE: the fit gives back RATE; 0.25 .. 1 MiB run below half of it (18 per step), the 2 MiB
    # ones at exactly half, and every one is below the suggested bucket, so merging saves each one's 40 µs: 24 x 40
    f = rules(diagnose(tmp_path, small_sizes_step(ALPHA_US), SMALL_BUCKETS))["small-reductions"]
    assert f.cost_us == pytest.approx(24 * ALPHA_US, rel=1e-6)
    assert f.evidence["reference_from"] == ["latency-bandwidth fit"]
    assert f.evidence["latency_bound_per_step"] == 18
    assert f.evidence["large_rate_gbps"] == pytest.approx(RATE / 1e3, rel=1e-3)
    assert set(f.fix.config or {}) == {"zero_optimization.reduce_bucket_size"}


@pytest.mark.symptom_without_cause("small-reductions")
def test_small_reductions_near_the_fitted_rate_are_not_latency_bound(tmp_path: Path) -> None:
    # the same sizes with 2 µs of latency: the smallest runs at 71 % of the fitted rate: small, not latency-bound
    assert "small-reductions" not in rules(diagnose(tmp_path, small_sizes_step(2.0), SMALL_BUCKETS))


# -- tiny-collectives sizes an all-gather by its buffer ------------------------------------------------------


def gathers(out_nelems: int | None) -> list[dict[str, Any]]:
    """40 times a GEMM [100 i, + 50) and an exposed all-gather [100 i + 60, + 20) of a 393216-element shard
    (768 KiB in bf16), with its 8-rank output of 3145728 elements (6 MiB) in the record or not."""
    extra = {"Out msg nelems": out_nelems} if out_nelems is not None else {}
    events = [step(1, 0, 10_000)]
    for i in range(40):
        a = {"Collective name": "_allgather_base", "Process Group Name": "0", "In msg nelems": 393216}
        events += [
            launch(100 * i, 2 * i + 1),
            kernel(GEMM, 100 * i, 50, corr=2 * i + 1),
            launch(100 * i + 1, 2 * i + 2),
            kernel(AG, 100 * i + 60, 20, stream=21, corr=2 * i + 2, dtype="BFloat16", **a, **extra),
        ]
    return events


@pytest.mark.symptom_without_cause("tiny-collectives")
def test_all_gathers_are_sized_by_their_buffer_where_the_record_gives_it(tmp_path: Path) -> None:
    # the 768 KiB shard is under 1 MiB, the 6 MiB buffer (nccl-tests' size) is not: no tiny collectives
    assert "tiny-collectives" not in rules(diagnose(tmp_path / "buffer", gathers(8 * 393216)))
    # without the output in the record only the shard is known: sized by it, and the evidence says so
    f = rules(diagnose(tmp_path / "shard", gathers(None)))["tiny-collectives"]
    assert f.evidence["sized_by"] == {"buffer": 0, "shard": 40}
    assert f.evidence["median_bytes"] == 2 * 393216
