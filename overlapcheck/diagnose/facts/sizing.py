"""Sizes the fixes are computed from: the trainable parameter count and the buckets seen in the trace."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.diagnose.finding import config_value
from overlapcheck.trace import classify as C

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

RS = C.COLLECTIVES.index("reduce_scatter")
AG = C.COLLECTIVES.index("all_gather")
DEFAULT_REDUCE_BUCKET = 500_000_000  # runtime/zero/config.py reduce_bucket_size default (v0.13.3 .. 0.19.x)
DEFAULT_PREFETCH_BUCKET = 50_000_000  # stage3_prefetch_bucket_size default


def parameter_count(view: RankFacts) -> tuple[int | None, str]:
    """Trainable parameters, and where the number came from: the job context (the simulator's job description
    or a `model.json` beside the traces), else the reduce-scatter input elements of one step (In msg nelems)."""
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
    """The configured reduce_bucket_size, else the largest reduce-scatter seen, else DeepSpeed's default."""
    value = config_value(view.config, "zero_optimization.reduce_bucket_size")
    if isinstance(value, int | float) and value > 0:
        return int(value), "config"
    g = view.gpu
    sel = view.is_comm & (g.coll == RS) & (g.nelems > 0)
    if sel.any():
        return int(np.max(g.nelems[sel])), "trace"
    return DEFAULT_REDUCE_BUCKET, "default"
