"""Gradients all-reduced where ZeRO would reduce-scatter them: `zero_optimization.reduce_scatter` false makes
every bucket an all-reduce (2(n-1)/n of the bucket per GPU on the bus, twice a reduce-scatter's (n-1)/n), and
what reduce-scatters would save of it (rules/reduction.py reports it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.bandwidth import message_bytes
from overlapcheck.diagnose.facts.dtypes import AR, MIN_ALL_REDUCE_BYTES, halved_transfer
from overlapcheck.diagnose.facts.sizing import RS
from overlapcheck.diagnose.finding import config_value

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

# DeepSpeed's gradient-reduction path (runtime/zero/stage3.py): with reduce_scatter false these call all_reduce
REDUCE_PATH = ("__avg_scatter_contiguous_grads", "__avg_scatter_grads")


@dataclass(frozen=True)
class GradientAllReduces:
    """The rank's gradient all-reduces: their rows, where the verdict came from ("ds_config" or "call site"),
    their bytes per step (0 without sizes), exposed µs (summed over steps) and `saved`: the windows a
    reduce-scatter of the same buckets (half the bus bytes) would no longer keep exposed."""

    rows: np.ndarray
    source: str
    bytes_total: float
    exposed_us: float
    saved: iv.Intervals


def gradient_allreduces(view: RankFacts) -> GradientAllReduces | None:
    """`_gradient_allreduces`, once per rank; None where the precondition does not hold."""
    return view.memo("gradient_allreduces", _gradient_allreduces)


def _under_reduce_path(view: RankFacts, rows: np.ndarray) -> bool:
    """Whether the first all-reduces were issued under DeepSpeed's gradient-reduction functions (Python stacks)."""
    threads, launch = view.launch_thread, view.launch
    for r in rows[:8].tolist():
        if threads[r] < 0:
            continue
        stack = view.callsites.stack(int(threads[r]), float(launch[r]))
        if any(f in frame for frame in stack for f in REDUCE_PATH):
            return True
    return False


def _gradient_allreduces(view: RankFacts) -> GradientAllReduces | None:
    """ZeRO-3 reduces each gradient bucket with a reduce-scatter (stage3.py __avg_scatter_grads ->
    reduce_scatter_coalesced); `zero_optimization.reduce_scatter: false` makes it an all-reduce of the whole
    bucket (__avg_scatter_contiguous_grads -> dist.all_reduce), each rank then keeping its partition: the ring
    moves 2(n-1)/n of the bucket per GPU instead of (n-1)/n. Precondition: the rank runs all-reduces of at least
    MIN_ALL_REDUCE_BYTES inside steps and no reduce-scatter, and either the config says `reduce_scatter: false`
    or, where the config does not say it, the all-reduces were issued under DeepSpeed's reduce path
    (REDUCE_PATH in the Python stacks). Cost: half of each all-reduce's transfer at the best rate measured for
    its size (facts/coverage.py `transfer_us`), at most its exposed time: what reduce-scatters of the same
    buckets no longer keep exposed."""
    g = view.gpu
    in_steps = view.gpu_step >= 0 if len(view.model.steps) else np.ones(len(g), dtype=bool)
    nbytes = message_bytes(view.model)
    if (view.is_comm & in_steps & (g.coll == RS)).any():
        return None  # the buckets are reduce-scattered
    rows = np.flatnonzero(view.is_comm & in_steps & (g.coll == AR) & (nbytes >= MIN_ALL_REDUCE_BYTES))
    if not len(rows):
        return None
    configured = config_value(view.config, "zero_optimization.reduce_scatter")
    if configured is False:
        source = "ds_config"
    elif configured is None and _under_reduce_path(view, rows):
        source = "call site"
    else:
        return None
    exposed_total, windows = halved_transfer(view, rows)
    return GradientAllReduces(rows, source, float(nbytes[rows].sum()), exposed_total, windows)
