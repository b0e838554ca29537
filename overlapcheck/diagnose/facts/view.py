"""What every rule of one rank reads: the trace model, its metrics and the job, plus derived arrays and the
facts several rules share (stalls, stream concurrency, host syncs), each computed once and lazily.

Costs are measured against `P`, the union of the rank's compute kernels (docs/metrics.md): the compute idle
time a cause explains is the part of a window `[a, b)` that no compute kernel covers.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.activities import launch_steps, launch_times, step_of
from overlapcheck.diagnose.facts import concurrency as _concurrency
from overlapcheck.diagnose.facts import stalls as _stalls
from overlapcheck.diagnose.facts import synccosts as _synccosts
from overlapcheck.diagnose.facts.callsite import CallSites
from overlapcheck.job import JobContext
from overlapcheck.model import RankMetrics
from overlapcheck.trace import classify as C
from overlapcheck.trace.model import TraceModel

T = TypeVar("T")


class RankFacts:
    """One rank's trace, its metrics and the job context, with shared derived arrays and facts."""

    def __init__(self, model: TraceModel, metrics: RankMetrics, job: JobContext | None = None):
        self.model = model
        self.metrics = metrics
        self.job = job or JobContext()
        self.config = self.job.ds_config
        self.gpu = model.gpu
        self._memo: dict[str, Any] = {}

    def memo(self, key: str, compute: Callable[[RankFacts], T]) -> T:
        """`compute(self)`, computed once per rank: how the modules of facts/ keep what several rules (or their
        own functions) read, without this class importing each of them."""
        if key not in self._memo:
            self._memo[key] = compute(self)
        value: T = self._memo[key]
        return value

    # -- identity and steps ---------------------------------------------------------------------
    @property
    def rank_id(self) -> int:
        return self.metrics.rank if self.metrics.rank is not None else 0

    @cached_property
    def n_steps(self) -> int:
        """Profiled steps that have GPU activity (at least 1: a trace without steps is one step)."""
        return max(1, len(self.metrics.steps))

    @cached_property
    def step_numbers(self) -> list[int]:
        return [s.step for s in self.metrics.steps]

    def steps_of_rows(self, rows: np.ndarray) -> list[int]:
        """The profiled steps the GPU activities `rows` (a mask or indices) belong to; every step when none does."""
        return sorted({int(s) for s in self.gpu_step[rows].tolist() if s >= 0}) or self.step_numbers

    @cached_property
    def step_time_us(self) -> float:
        """Mean step period (docs/metrics.md; the whole span when the trace has no steps)."""
        return float(self.metrics.step_time_us or 0.0) / self.n_steps

    def step_of(self, times: np.ndarray) -> np.ndarray:
        return step_of(self.model, np.asarray(times, dtype=np.float64))

    def in_steps(self, times: np.ndarray) -> np.ndarray:
        """Mask of times that fall in a profiled step (all of them when the trace has no steps)."""
        if not len(self.model.steps):
            return np.ones(len(times), dtype=bool)
        return self.step_of(times) >= 0

    # -- names ------------------------------------------------------------------------------------
    @cached_property
    def names(self) -> np.ndarray:
        return np.array(self.model.names + [""], dtype=object)  # index -1 -> ""

    def name_mask(self, column: np.ndarray, predicate: Callable[[str], bool]) -> np.ndarray:
        """Rows whose interned name satisfies `predicate`, testing each distinct name once."""
        if not len(column):
            return np.zeros(0, dtype=bool)
        uniq = np.unique(column)
        good = [u for u in uniq.tolist() if predicate(self.names[u])]
        return np.isin(column, good)

    # -- GPU activity -----------------------------------------------------------------------------
    @cached_property
    def launch(self) -> np.ndarray:
        """CPU time at which each GPU activity was issued."""
        return launch_times(self.model) if len(self.gpu) else np.zeros(0)

    @cached_property
    def launch_thread(self) -> np.ndarray:
        """The CPU thread that launched each GPU activity (-1 when its runtime call is not in the trace)."""
        rt, g = self.model.runtime, self.gpu
        out = np.full(len(g), -1, dtype=np.int64)
        if not len(rt) or not len(g):
            return out
        order = np.argsort(rt.correlation, kind="stable")
        corr = rt.correlation[order]
        i = np.clip(np.searchsorted(corr, g.correlation), 0, len(corr) - 1)
        hit = (g.correlation >= 0) & (corr[i] == g.correlation)
        out[hit] = rt.thread[order[i[hit]]]
        return out

    @cached_property
    def gpu_step(self) -> np.ndarray:
        """The step of each GPU activity, as the metrics attribute it: by its launch; -1 when the launch is in no
        step or not in the trace (an activity the previous, unprofiled iteration left running)."""
        return launch_steps(self.model) if len(self.gpu) else np.zeros(0, dtype=np.int64)

    @cached_property
    def step_rows(self) -> dict[int, np.ndarray]:
        """GPU rows of each step (by `gpu_step`, -1 included), ascending: one sort instead of a mask per step."""
        return self.group_by_step(np.arange(len(self.gpu)))

    def group_by_step(self, rows: np.ndarray) -> dict[int, np.ndarray]:
        """`rows` (ascending GPU row indices) split by their step, in step order, each group still ascending."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return {}
        steps = self.gpu_step[rows]
        order = np.argsort(steps, kind="stable")
        rows, steps = rows[order], steps[order]
        cuts = np.flatnonzero(steps[1:] != steps[:-1]) + 1
        starts = np.concatenate([[0], cuts]).tolist()
        ends = [*cuts.tolist(), len(rows)]
        return {int(steps[a]): rows[a:b] for a, b in zip(starts, ends, strict=True)}

    @cached_property
    def is_compute(self) -> np.ndarray:
        return self.gpu.cls == C.COMPUTE

    @cached_property
    def is_comm(self) -> np.ndarray:
        return self.gpu.cls == C.COMM

    @cached_property
    def compute(self) -> iv.Intervals:
        """P: the union of compute kernels on every stream."""
        return iv.union(self.gpu.start[self.is_compute], self.gpu.end[self.is_compute])

    @cached_property
    def all_gathers(self) -> iv.Intervals:
        sel = self.is_comm & (self.gpu.coll == C.COLLECTIVES.index("all_gather"))
        return iv.union(self.gpu.start[sel], self.gpu.end[sel])

    @cached_property
    def step_first_gathers(self) -> np.ndarray:
        """GPU rows of each step's first all-gather (the parameters of the first module)."""
        sel = np.flatnonzero(self.is_comm & (self.gpu.coll == C.COLLECTIVES.index("all_gather")))
        if not len(sel):
            return sel
        sel = sel[np.lexsort((self.gpu.start[sel], self.gpu_step[sel]))]
        steps = self.gpu_step[sel]
        return sel[np.append(True, steps[1:] != steps[:-1])]

    @cached_property
    def first_gathers(self) -> np.ndarray:
        """GPU rows of each step's first all-gather (the parameters of the first module) that the host issued
        only after the compute-stream work launched before it had ended: nothing was left to hide it behind, so
        its wait is inherent. One issued while the previous step's compute still ran (the host ahead of the GPU)
        overlaps that compute in a healthy job; if it is exposed, whatever serialized or delayed it owns the cost."""
        first = self.step_first_gathers
        return first[self._queued_at_launch(first) <= 0]

    def _queued_at_launch(self, rows: np.ndarray) -> np.ndarray:
        """For each GPU row: how long the compute-stream work launched before it still ran after its launch
        (<= 0: none). Counts compute anywhere and anything on the compute stream: an activity there that ends
        after the launch shows the stream still had work queued, even work launched before the trace began."""
        comp = np.flatnonzero(self.is_compute | (self.gpu.stream == self.compute_stream))
        if not len(rows) or not len(comp):
            return np.full(len(rows), -np.inf)
        comp = comp[np.argsort(self.launch[comp], kind="stable")]
        queued_end = np.maximum.accumulate(self.gpu.end[comp])
        i = np.searchsorted(self.launch[comp], self.launch[rows], side="left")
        return np.where(i > 0, queued_end[np.maximum(i - 1, 0)], -np.inf) - self.launch[rows]

    @cached_property
    def first_gather_waits(self) -> iv.Intervals:
        """The part of each step's first all-gather that compute waits for in any configuration: all of an
        inherent one; of one issued while compute work was queued, what that work could not have hidden (the
        end of the gather beyond the queued time)."""
        return iv.union(self.first_gather_wait_starts, self.gpu.end[self.step_first_gathers])

    @cached_property
    def first_gather_wait_starts(self) -> np.ndarray:
        """Where the wait of each step's first all-gather (`step_first_gathers`) begins: its start, or the end
        of the compute queued when it was issued, whichever is later (at most its end)."""
        first = self.step_first_gathers
        g = self.gpu
        hidden = np.clip(self._queued_at_launch(first), 0.0, None)
        return np.minimum(g.start[first] + hidden, g.end[first])

    @cached_property
    def compute_stream_busy(self) -> iv.Intervals:
        """P plus everything on the compute stream: time the compute stream could not have used anyway."""
        on_stream = self.gpu.stream == self.compute_stream
        return iv.combine(self.compute, iv.union(self.gpu.start[on_stream], self.gpu.end[on_stream]))

    def covered(self, t: np.ndarray, busy: iv.Intervals | None = None) -> np.ndarray:
        """|B ∩ (-inf, t)| for each t, B = `busy` (default P)."""
        b = self.compute if busy is None else busy
        t = np.asarray(t, dtype=np.float64)
        if not len(b):
            return np.zeros(len(t))
        lengths = b.ends - b.starts
        cum = np.concatenate([[0.0], np.cumsum(lengths)])
        i = np.searchsorted(b.starts, t, side="right")  # intervals starting before t
        prev = np.maximum(i - 1, 0)
        inside = np.clip(t - b.starts[prev], 0.0, lengths[prev])
        return np.where(i > 0, cum[prev] + inside, 0.0)

    def idle(self, a: np.ndarray, b: np.ndarray, busy: iv.Intervals | None = None) -> np.ndarray:
        """|[a, b) − B| for each window (B = `busy`, default P): the compute idle time inside it."""
        a = np.asarray(a, dtype=np.float64)
        b = np.maximum(np.asarray(b, dtype=np.float64), a)
        return (b - a) - (self.covered(b, busy) - self.covered(a, busy))

    @cached_property
    def compute_stream(self) -> int:
        """The stream that runs the most compute time (the default/current stream of the training loop)."""
        sel = self.is_compute
        if not sel.any():
            return -1
        streams = self.gpu.stream[sel]
        busy = np.bincount(np.unique(streams, return_inverse=True)[1], weights=(self.gpu.end - self.gpu.start)[sel])
        return int(np.unique(streams)[int(np.argmax(busy))])

    def next_compute_start(self, times: np.ndarray) -> np.ndarray:
        """Start of the first compute kernel launched at or after each CPU time (inf when none)."""
        sel = np.flatnonzero(self.is_compute)
        times = np.asarray(times, dtype=np.float64)
        if not len(sel):
            return np.full(len(times), np.inf)
        order = sel[np.argsort(self.launch[sel], kind="stable")]
        launch, start = self.launch[order], self.gpu.start[order]
        # earliest start among kernels launched after t: suffix minimum over launch order
        suffix_min = np.minimum.accumulate(start[::-1])[::-1]
        i = np.searchsorted(launch, times, side="left")
        out = np.full(len(times), np.inf)
        ok = i < len(launch)
        out[ok] = suffix_min[i[ok]]
        return out

    # -- CPU side -----------------------------------------------------------------------------------
    @cached_property
    def callsites(self) -> CallSites:
        return CallSites(self.model, self.names)

    def runtime_named(self, *names: str) -> np.ndarray:
        """Indices of runtime calls with one of these names (cudaStreamSynchronize, ...)."""
        rt = self.model.runtime
        wanted = set(names)
        return np.flatnonzero(self.name_mask(rt.name, lambda n: n in wanted))

    # -- per-step aggregation -------------------------------------------------------------------------
    def per_step(self, values: np.ndarray, times: np.ndarray) -> tuple[float, list[int]]:
        """Mean per profiled step of `values` (issued at CPU `times`), and the steps where they occur."""
        values = np.asarray(values, dtype=np.float64)
        if not len(values):
            return 0.0, []
        if not len(self.model.steps):
            return float(values.sum()), []
        steps = self.step_of(times)
        keep = steps >= 0
        total = float(values[keep].sum())
        present = sorted({int(s) for s in steps[keep & (values > 0)].tolist()})
        return total / self.n_steps, present

    # -- facts shared by several rules --------------------------------------------------------------
    @cached_property
    def stalls(self) -> _stalls.Stalls:
        """The compute stream's stalls on other streams."""
        return _stalls.find_stalls(self)

    @cached_property
    def no_concurrency(self) -> bool:
        """Several streams carry work, communication among it, yet no two streams ever run at once."""
        return _concurrency.no_concurrency(self)

    @cached_property
    def shared_communicator(self) -> str | None:
        """The process group that carries both all-gathers and reduce-scatters, if any."""
        return _concurrency.shared_communicator(self)

    @cached_property
    def claimed_by_communicator(self) -> np.ndarray:
        """Per stall: the cost that the shared-communicator rule owns (before the all-gather and wait rules)."""
        return _concurrency.claimed_by_specific(self, self.stalls)

    @cached_property
    def host_syncs(self) -> _synccosts.SyncCosts:
        """Every host-blocking call, its owning rule and what it cost."""
        return _synccosts.sync_costs(self)
