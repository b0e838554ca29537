"""Gradient reductions sent in fp32 under bf16 / fp16 training, and what the training dtype would save of
them (rules/dtypes.py reports it; rules/buckets.py reduce-transfer-bound leaves those windows to it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.bandwidth import message_bytes
from overlapcheck.diagnose.facts.coverage import transfer_us
from overlapcheck.diagnose.facts.sizing import AG, RS
from overlapcheck.diagnose.finding import config_value
from overlapcheck.trace import classify as C

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

AR = C.COLLECTIVES.index("all_reduce")
FP32_SHARE = 0.5  # fp32 carries at least this share of the step's gradient-reduction bytes (or kernels)
MIN_ALL_REDUCE_BYTES = 1 << 20  # an all-reduce smaller than this is a scalar (the gradient norm), not gradients
FP32_RECORDS = {"Float"}
HALF_RECORDS = {"BFloat16": "bf16", "Half": "fp16"}
# the dtype part of an NCCL kernel name: ncclDevKernel_ReduceScatter_Sum_f32_RING_LL (NCCL >= 2.19),
# ncclKernel_ReduceScatter_RING_LL_Sum_float (before)
FP32_NAMES = ("_f32_", "_f32(", "_Sum_float")
HALF_NAMES = {"_bf16_": "bf16", "_bf16(": "bf16", "__nv_bfloat16": "bf16", "_f16_": "fp16", "_half": "fp16"}


def _dtype_of(view: RankFacts, row: int) -> str | None:
    """'fp32', 'bf16' or 'fp16' of one collective: its record's dtype (record_param_comms / kernel args), else
    its NCCL kernel name; None when neither says."""
    g = view.gpu
    record = view.names[g.dtype[row]] if g.dtype[row] >= 0 else ""
    if record in FP32_RECORDS:
        return "fp32"
    if record in HALF_RECORDS:
        return HALF_RECORDS[record]
    name = view.names[g.name[row]]
    if any(s in name for s in FP32_NAMES):
        return "fp32"
    return next((d for s, d in HALF_NAMES.items() if s in name), None)


def training_dtype(view: RankFacts) -> tuple[str | None, str]:
    """The training dtype and where it came from: the config's `bf16.enabled` / `fp16.enabled` (both false or
    absent in a config that has either section: fp32), else the all-gathers' records (ZeRO-3 gathers the bit16
    parameters in their own dtype); None when neither says."""
    if config_value(view.config, "bf16.enabled") is True:
        return "bf16", "ds_config bf16.enabled"
    if config_value(view.config, "bfloat16.enabled") is True:  # runtime/constants.py BFLOAT16_OLD, still read
        return "bf16", "ds_config bfloat16.enabled"
    if config_value(view.config, "fp16.enabled") is True:
        return "fp16", "ds_config fp16.enabled"
    if any(config_value(view.config, key) is not None for key in ("bf16", "bfloat16", "fp16")):
        return "fp32", "ds_config"
    g = view.gpu
    gathers = np.flatnonzero(view.is_comm & (g.coll == AG) & (g.dtype >= 0))
    kinds = [_dtype_of(view, r) for r in gathers.tolist()]
    half = [k for k in kinds if k in ("bf16", "fp16")]
    if kinds and len(half) >= FP32_SHARE * len(kinds):
        return max(set(half), key=half.count), "all-gather records"
    return None, "unknown"


def halved_transfer(view: RankFacts, rows: np.ndarray) -> tuple[float, iv.Intervals]:
    """For GPU `rows` whose bytes a fix halves: their exposed time in total, and the windows the fix saves (of
    each row, the last min(exposed, half its transfer at the best rate) µs of its exposed part)."""
    g = view.gpu
    transfer = transfer_us(view)
    starts: list[float] = []
    ends: list[float] = []
    exposed_total = 0.0
    for r in rows.tolist():
        s, e = float(g.start[r]), float(g.end[r])
        exposed = iv.length(iv.subtract(iv.union(np.array([s]), np.array([e])), view.compute))
        exposed_total += exposed
        saved = min(exposed, 0.5 * float(transfer[r]))
        if saved <= 0:
            continue
        a, b = exposed_tail(s, e, view.compute, saved)
        starts += a
        ends += b
    return exposed_total, iv.union(np.array(starts), np.array(ends)) if starts else iv.EMPTY


def exposed_tail(start: float, end: float, compute: iv.Intervals, saved: float) -> tuple[list[float], list[float]]:
    """The last `saved` µs of the exposed part of [start, end): what a shorter transfer would end sooner."""
    exposed = iv.subtract(iv.union(np.array([start]), np.array([end])), compute)
    starts, ends = [], []
    left = saved
    for s, e in zip(exposed.starts[::-1].tolist(), exposed.ends[::-1].tolist(), strict=True):
        if left <= 0:
            break
        take = min(left, e - s)
        starts.append(e - take)
        ends.append(e)
        left -= take
    return starts, ends


@dataclass(frozen=True)
class Fp32Reductions:
    """The rank's fp32 gradient reductions under half training: their rows, share of the reduction bytes (of the
    kernels without sizes), the training dtype and where it came from, their exposed µs (summed over steps) and
    `saved`: the windows a transfer in the training dtype would no longer keep exposed."""

    rows: np.ndarray
    share: float
    training: str
    training_from: str
    sized: bool
    exposed_us: float
    saved: iv.Intervals


def fp32_reductions(view: RankFacts) -> Fp32Reductions | None:
    """`_fp32_reductions`, once per rank; None where the precondition does not hold."""
    return view.memo("fp32_reductions", _fp32_reductions)


def _fp32_reductions(view: RankFacts) -> Fp32Reductions | None:
    """DeepSpeed reduces gradients in `communication_data_type` (runtime/config.py get_communication_data_type:
    "fp32", "fp16" or "bf16"; unset, ZeRO-3 reduces in the bit16 gradients' own dtype, stage3.py
    __avg_scatter_grads casts to it when it differs). Set to fp32 under bf16 or fp16 training, every reduce-scatter
    (and gradient all-reduce) moves 4-byte elements: the NCCL kernels are `_f32` (`float` before NCCL 2.19) and
    record_param_comms says dtype Float, twice the bytes of the training dtype. Precondition: the training dtype
    is bf16 or fp16 (config, else the all-gathers' records), and fp32 reductions carry at least FP32_SHARE of the
    step's gradient-reduction bytes (kernels, without sizes). Cost: half of each fp32 reduction's transfer at the
    best rate measured for its size (facts/coverage.py `transfer_us`, latency included: an upper bound for small
    messages), at most its exposed time: what the same reductions in the training dtype no longer keep exposed."""
    g = view.gpu
    in_steps = view.gpu_step >= 0 if len(view.model.steps) else np.ones(len(g), dtype=bool)
    nbytes = message_bytes(view.model)
    reductions = view.is_comm & in_steps & ((g.coll == RS) | ((g.coll == AR) & (nbytes >= MIN_ALL_REDUCE_BYTES)))
    if not (g.coll[reductions] == RS).any():
        reductions &= g.coll == AR  # DDP-like: all-reduces only
    else:
        reductions &= g.coll == RS
    rows = np.flatnonzero(reductions)
    if not len(rows):
        return None
    train, train_from = training_dtype(view)
    if train not in ("bf16", "fp16"):
        return None  # fp32 training: fp32 communication is the right dtype
    kinds = np.array([_dtype_of(view, r) or "" for r in rows.tolist()])
    fp32 = rows[kinds == "fp32"]
    sized = (nbytes[rows] > 0).all()
    weight = nbytes[rows].astype(np.float64) if sized else np.ones(len(rows))
    share = float(weight[kinds == "fp32"].sum() / max(1e-9, weight.sum()))
    if not len(fp32) or share < FP32_SHARE:
        return None
    exposed_total, windows = halved_transfer(view, fp32)
    return Fp32Reductions(fp32, share, train, train_from, bool(sized), exposed_total, windows)
