"""Sizes the fixes are computed from: the trainable parameter count, the buckets seen in the trace, the bucket
size to recommend and the share of a step's gradients its last bucket would hold."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.diagnose.finding import config_value, round_size
from overlapcheck.trace import classify as C

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

RS = C.COLLECTIVES.index("reduce_scatter")
AG = C.COLLECTIVES.index("all_gather")
DEFAULT_REDUCE_BUCKET = 500_000_000  # runtime/zero/config.py reduce_bucket_size default (v0.13.3 .. 0.19.x)
DEFAULT_PREFETCH_BUCKET = 50_000_000  # stage3_prefetch_bucket_size default
RECOMMENDED_BUCKET = 50_000_000  # the size DeepSpeed's ZeRO-3 examples and HF `auto` land near for 1-10B models


def parameter_count(view: RankFacts) -> tuple[int | None, str]:
    """Trainable parameters, and where the number came from: the job context (the simulator's job description
    or a `model.json` beside the traces), else the reduce-scatter input elements of one step (In msg nelems);
    computed once per rank."""
    return view.memo("parameter_count", _parameter_count)


def _parameter_count(view: RankFacts) -> tuple[int | None, str]:
    if view.job.parameters is not None:
        return view.job.parameters, view.job.parameters_source or "job"
    per_step = reduce_scatter_elements_per_step(view)
    return (per_step, "trace") if per_step else (None, "unknown")


def reduce_scatter_elements_per_step(view: RankFacts) -> int | None:
    """Elements reduce-scattered per step (DeepSpeed reduce-scatters every trainable gradient once)."""
    g = view.gpu
    sel = view.is_comm & (g.coll == RS) & (g.nelems > 0)
    if not sel.any():
        return None
    if len(view.model.steps):
        sel &= view.gpu_step >= 0
    return int(g.nelems[sel].sum() / view.n_steps) or None


def reduce_bucket_size(view: RankFacts) -> tuple[int, str]:
    """The configured reduce_bucket_size, else the largest reduce-scatter seen, else DeepSpeed's default
    (computed once per rank)."""
    return view.memo("reduce_bucket_size", _reduce_bucket_size)


def _reduce_bucket_size(view: RankFacts) -> tuple[int, str]:
    value = config_value(view.config, "zero_optimization.reduce_bucket_size")
    if isinstance(value, int | float) and value > 0:
        return int(value), "config"
    g = view.gpu
    sel = view.is_comm & (g.coll == RS) & (g.nelems > 0)
    if sel.any():
        return int(np.max(g.nelems[sel])), "trace"
    return DEFAULT_REDUCE_BUCKET, "default"


def gradient_copies(view: RankFacts) -> np.ndarray:
    """Mask of the device-to-device copies with a size: gradients copied into a bucket (computed once per rank)."""
    return view.memo("gradient_copies", _gradient_copies)


def _gradient_copies(view: RankFacts) -> np.ndarray:
    g = view.gpu
    dtod = view.name_mask(g.name, lambda n: "DtoD" in n or "Device -> Device" in n)
    return (g.cls == C.MEMCPY) & (g.nbytes > 0) & dtod


def last_bucket_fraction(
    view: RankFacts, rows: np.ndarray, bucket_elems: int, elems_per_step: int, copies_mask: np.ndarray | None = None
) -> float:
    """Share of the step's gradient volume that would be in the last bucket with `bucket_elems` buckets.

    DeepSpeed flushes when `elements + numel > reduce_bucket_size` (stage3.py
    reduce_independent_p_g_buckets_and_remove_grads), so the last bucket is what is left after the last flush.
    Gradients are the device-to-device copies into the bucket (`__add_grad_to_ipg_bucket` copy_), in order.
    `rows`: the step's GPU rows (ascending); `copies_mask`: `gradient_copies(view)`, when already known."""
    g = view.gpu
    copies = rows[(gradient_copies(view) if copies_mask is None else copies_mask)[rows]]
    if not len(copies) or elems_per_step <= 0:
        return min(1.0, bucket_elems / elems_per_step) if elems_per_step > 0 else 1.0
    sizes = g.nbytes[copies[np.argsort(view.launch[copies], kind="stable")]].astype(np.float64)
    limit = bucket_elems * sizes.sum() / elems_per_step  # the bucket in bytes of these copies
    current = 0.0
    for n in sizes.tolist():
        if current and current + n > limit:
            current = 0.0
        current += n
    return float(current / sizes.sum())


def recommended_bucket(params: int | None) -> int:
    """5e7 elements (the ZeRO-3 examples' size; several buckets per step from 2e8 parameters up), else a quarter
    of a smaller model so that at least four buckets overlap backward."""
    if params is None or params >= 4 * RECOMMENDED_BUCKET:
        return RECOMMENDED_BUCKET
    return round_size(params / 4)
