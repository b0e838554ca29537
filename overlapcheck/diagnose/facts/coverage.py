"""What the findings of one rank explain of its exposed communication, and what nobody explains.

All sets are windows of the rank's own trace time. `E`, the exposed communication, is the union of the
communication kernels a profiled step issued minus `P` (the union of compute kernels), as in docs/metrics.md.
Part of it every ZeRO-3 (and DDP) schedule has, whatever the config: the transfer of each step's first
all-gather (nothing ran before it to hide behind) and of the last gradient bucket's reduction after the last
backward kernel, each at the best rate measured for that collective (`transfer_us`). Only the transfer is
inherent: the rest of those kernels is waiting for peers or a transfer slower than the job reaches elsewhere,
and is someone's. A finding explains the part of E its windows cover (`Finding.covers`, counted once where
findings overlap); of the rest, the inherent part is no one's fault, and what is left is unexplained.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.activities import PHASES, phase_of, phase_windows
from overlapcheck.analysis.bandwidth import group_sizes, message_bytes
from overlapcheck.diagnose.facts.sizing import (
    RS,
    gradient_copies,
    last_bucket_fraction,
    parameter_count,
    recommended_bucket,
    reduce_bucket_size,
)
from overlapcheck.model import Finding
from overlapcheck.trace import classify as C

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

AR = C.COLLECTIVES.index("all_reduce")
# a kernel is "far" slower than the best of its kind and size beyond this ratio (a rate below 2/3 of the best):
# within it, jitter and links shared with concurrent collectives, and all of the kernel counts as its transfer
FAR_SLOWER = 1.5


@dataclass(frozen=True)
class Coverage:
    """One rank's exposed communication split three ways (µs per profiled step), and the unexplained windows."""

    exposed_us: float
    inherent_us: float
    explained_us: float  # covered by at least one finding
    unexplained: iv.Intervals
    inherent: iv.Intervals = iv.EMPTY  # the first gathers' and last buckets' transfer no finding covers
    tails: iv.Intervals = iv.EMPTY  # those kernels whole (read as all transfer), where no finding covers them

    @property
    def unexplained_us(self) -> float:
        return max(0.0, self.exposed_us - self.inherent_us - self.explained_us)


def exposed_windows(view: RankFacts) -> iv.Intervals:
    """E: the communication kernels issued inside a profiled step (all of them without steps), minus P."""
    g = view.gpu
    sel = view.is_comm & ((view.gpu_step >= 0) if len(view.model.steps) else True)
    return iv.subtract(iv.union(g.start[sel], g.end[sel]), view.compute)


def transfer_us(view: RankFacts) -> np.ndarray:
    """Per GPU row, the least time its collective's transfer takes at the best rate this rank measured: the
    shortest duration among the rank's communication kernels of the same kind, message size and group size (a
    kernel's duration includes its wait for peers; the fastest of equal transfers has the least of it), when the
    kernel is far slower than that (FAR_SLOWER); else, and for a kernel of unknown size, its own duration.
    Computed once per rank."""
    return view.memo("transfer_us", _transfer_us)


def _transfer_us(view: RankFacts) -> np.ndarray:
    g = view.gpu
    dur = g.end - g.start
    out = dur.copy()
    comm = np.flatnonzero(view.is_comm)
    sizes = message_bytes(view.model)
    groups = group_sizes(view.model)
    known = comm[sizes[comm] > 0]
    best: dict[tuple[int, int, int], float] = {}
    for r, kind, size, group in zip(
        known.tolist(), g.coll[known].tolist(), sizes[known].tolist(), groups[known].tolist(), strict=True
    ):
        key = (kind, size, group)
        best[key] = min(best.get(key, np.inf), float(dur[r]))
    for r, kind, size, group in zip(
        known.tolist(), g.coll[known].tolist(), sizes[known].tolist(), groups[known].tolist(), strict=True
    ):
        fastest = best[(kind, size, group)]
        if dur[r] > FAR_SLOWER * fastest:
            out[r] = fastest
    return out


@dataclass(frozen=True)
class GradientTail:
    """One step's gradient reductions that ran once its backward compute had ended: `rows` (GPU rows of the
    step's reduce-scatters, or all-reduces when it has none, ending after `after`), the last-ending one `last`
    (the last bucket), and `after`, the end of the step's last backward compute-stream kernel (the last
    reduction's start when the trace has no backward ops)."""

    step: int
    rows: np.ndarray
    last: int
    after: float


def gradient_tails(view: RankFacts) -> list[GradientTail]:
    """Per step, the gradient reductions after backward compute (computed once per rank)."""
    return view.memo("gradient_tails", _gradient_tails)


def _gradient_tails(view: RankFacts) -> list[GradientTail]:
    g = view.gpu
    phase = phase_of(view.model, view.launch, phase_windows(view.model))
    # on the compute stream: the bucket's own kernels (scaling, copies) run on the reduction stream
    backward = np.flatnonzero(view.is_compute & (g.stream == view.compute_stream) & (phase == PHASES.index("backward")))
    backward_end = {step: float(g.end[rows].max()) for step, rows in view.group_by_step(backward).items()}
    out = []
    for kind in (RS, AR):
        grads = np.flatnonzero(view.is_comm & (g.coll == kind) & (view.gpu_step >= 0))
        for step, rows in view.group_by_step(grads).items():
            if kind == AR and ((g.coll[view.step_rows[step]] == RS) & view.is_comm[view.step_rows[step]]).any():
                continue  # ZeRO's all-reduces (gradient norm, overflow check) are not gradient buckets
            last = int(rows[np.argmax(g.end[rows])])
            if step not in backward_end and _compute_after(view, step, float(g.end[last])):
                continue  # no backward ops to tell, and compute of the step follows it: not the step's tail
            after = backward_end.get(step, float(g.start[last]))
            out.append(GradientTail(step, rows[g.end[rows] > after], last, after))
    return out


def inherent_windows(view: RankFacts, transfer: np.ndarray | None = None) -> iv.Intervals:
    """The exposed communication no change removes: per step, the transfer at the best rate (`transfer_us`) of
    the first all-gather that compute waits for in any configuration (the end of the wait in
    RankFacts.first_gather_waits), and of the last gradient reduction once backward compute has ended (the last
    bucket, flushed by the epilogue): the step's last-ending reduce-scatter (all-reduce when it has none, as in
    DDP), after the end of the last compute-stream kernel its backward pass issued; without backward ops in the
    trace, when no compute-stream compute of the step starts after it. Of a last bucket that holds the whole
    model's gradients only the last bucket of the recommended size is inherent (`whole_model_share`). Reductions
    still queued behind it, and the part of a kernel beyond its transfer (waiting for peers, a slow link), are not
    inherent. With `transfer` = each kernel's duration: the whole of those kernels, as if they were all transfer
    (a slow link, not late peers)."""
    g = view.gpu
    transfer = transfer_us(view) if transfer is None else transfer
    first = view.step_first_gathers
    waits_from = view.first_gather_wait_starts.copy()
    if len(view.model.steps):
        # the first profiled step's: what could have hidden it ran before the profiler started, so the trace
        # cannot tell (as for the syncs at its boundary, hostsyncs.per_step_cost): its wait is taken as inherent
        opening = view.gpu_step[first] == int(view.model.steps.number.min())
        waits_from[opening] = g.start[first][opening]
    starts, ends = [np.maximum(waits_from, g.end[first] - transfer[first])], [g.end[first]]
    for tail in gradient_tails(view):
        last = tail.last
        share = whole_model_share(view, tail)
        lo = max(tail.after, float(g.end[last] - share * transfer[last]))
        starts.append(np.array([max(float(g.start[last]), lo)]))
        ends.append(g.end[last : last + 1])
    return iv.subtract(iv.union(np.concatenate(starts), np.concatenate(ends)), view.compute)


def whole_model_share(view: RankFacts, tail: GradientTail) -> float:
    """The share of the last bucket's transfer that is inherent: all of it, unless that bucket holds the whole
    model's gradients, which is the deferral `reduce-scatter-deferred`'s fix (a smaller reduce_bucket_size)
    removes; then only the last bucket of the recommended size (`last_bucket_fraction`). Whole-model: the
    configured reduce_bucket_size is at least a parameter count known from outside the trace, or the step's only
    gradient reduction took in more than one gradient copy (several gradients one flush merged; a single tensor
    cannot be split, and a count read from the trace's own reductions would agree with any bucket)."""
    g = view.gpu
    rows = view.step_rows.get(tail.step, np.zeros(0, dtype=np.int64))
    kind = int(g.coll[tail.last])
    mine = rows[view.is_comm[rows] & (g.coll[rows] == kind)]
    reductions = len(mine)
    copies = gradient_copies(view)
    bucket, bucket_src = reduce_bucket_size(view)
    params, params_src = parameter_count(view)
    configured = bucket_src == "config" and params_src != "trace" and params is not None and bucket >= params
    if not (configured or (reductions == 1 and int(copies[rows].sum()) > 1)):
        return 1.0
    elems = int(np.maximum(g.nelems[mine], g.out_nelems[mine]).clip(0).sum()) or (params or 0)
    return last_bucket_fraction(view, rows, recommended_bucket(params or elems), elems, copies)


def _compute_after(view: RankFacts, step: int, t: float) -> bool:
    """Whether a compute-stream compute kernel of `step` starts at or after `t` (the reduction stream's own
    kernels, e.g. partition_grads' copy after each reduce-scatter, are not compute that follows the tail)."""
    rows = view.step_rows.get(step)
    if rows is None:
        return False
    on_stream = view.is_compute[rows] & (view.gpu.stream[rows] == view.compute_stream)
    return bool((on_stream & (view.gpu.start[rows] >= t)).any())


def coverage(view: RankFacts, findings: Sequence[Finding], limits: Collection[str] = ()) -> Coverage:
    """Split the rank's exposed communication: covered by `findings` (their `covers` windows, counted once where
    they overlap), inherent (and covered by none), and the rest, unexplained. The windows of findings whose rule
    is in `limits` (a limit of the hardware, e.g. all-gathers that outrun the compute at this bandwidth) count as
    inherent: no change to the job's schedule or config removes them."""
    exposed = exposed_windows(view)
    covered = limited = iv.EMPTY
    for f in findings:
        if isinstance(f.covers, iv.Intervals) and len(f.covers) and f.cost_us > 0:
            if f.rule in limits:
                limited = iv.combine(limited, f.covers)
            else:
                covered = iv.combine(covered, f.covers)
    explained = iv.intersect(exposed, covered)
    rest = iv.subtract(exposed, covered)
    transfer = iv.intersect(rest, inherent_windows(view))
    inherent = iv.intersect(rest, iv.combine(transfer, limited))
    whole = view.gpu.end - view.gpu.start
    n = view.n_steps
    return Coverage(
        exposed_us=iv.length(exposed) / n,
        inherent_us=iv.length(inherent) / n,
        explained_us=iv.length(explained) / n,
        unexplained=iv.subtract(rest, inherent),
        inherent=transfer,
        tails=iv.intersect(rest, inherent_windows(view, whole)),
    )


LARGE_BYTES = 16 << 20  # a reduce-scatter this large runs at the link's bandwidth: the reference rate
FIT_SIZE_RANGE = 4.0  # the largest and smallest reduce-scatter sizes a latency-bandwidth fit needs apart


@dataclass(frozen=True)
class ReductionRates:
    """The rank's reduce-scatters of known size in its steps (`rows`, GPU rows), and per process group the rate
    (bytes per µs) such a transfer reaches once its bytes, not NCCL's per-call latency, set its time: the best
    rate at their transfer time (`transfer_us`) of the group's reduce-scatters of at least LARGE_BYTES, else the
    asymptote of a latency-bandwidth fit (`source` says which); a group with neither has no reference."""

    rows: np.ndarray
    nbytes: np.ndarray  # per GPU row (float), as message_bytes
    transfer: np.ndarray  # per GPU row, transfer_us
    reference: dict[int, float]
    source: dict[int, str]


def reduction_rates(view: RankFacts) -> ReductionRates:
    """The rank's `ReductionRates`, computed once (small-reductions and `reduction_load` read them)."""
    return view.memo("reduction_rates", _reduction_rates)


def _reduction_rates(view: RankFacts) -> ReductionRates:
    g = view.gpu
    in_steps = view.gpu_step >= 0 if len(view.model.steps) else np.ones(len(g), dtype=bool)
    nbytes = message_bytes(view.model).astype(np.float64)
    rs = np.flatnonzero(view.is_comm & in_steps & (g.coll == RS) & (nbytes > 0))
    transfer = transfer_us(view)
    reference: dict[int, float] = {}
    source: dict[int, str] = {}
    if len(rs):
        rate = nbytes[rs] / np.maximum(transfer[rs], 1e-3)  # bytes per µs at the transfer time
        for pg in np.unique(g.pg[rs]).tolist():
            mine = g.pg[rs] == pg
            large = mine & (nbytes[rs] >= LARGE_BYTES)
            if large.any():
                reference[int(pg)], source[int(pg)] = float(rate[large].max()), "large reduce-scatters"
            elif (fitted := _asymptotic_rate(nbytes[rs[mine]], transfer[rs[mine]])) is not None:
                reference[int(pg)], source[int(pg)] = fitted, "latency-bandwidth fit"
    return ReductionRates(rs, nbytes, transfer, reference, source)


def _asymptotic_rate(nbytes: np.ndarray, transfer: np.ndarray) -> float | None:
    """The rate (bytes per µs) a group's reduce-scatters tend to as they grow, when none is large enough to show
    it: the Hockney (latency-bandwidth) model t = α + bytes / rate fitted by least squares to the fastest transfer
    of each distinct size (waiting for peers is least there). Needs sizes at least FIT_SIZE_RANGE apart (closer
    ones cannot tell α from the bytes' time) and a fit with α >= 0 and a positive rate; None otherwise."""
    sizes = np.unique(nbytes)
    if len(sizes) < 2 or sizes[-1] < FIT_SIZE_RANGE * sizes[0]:
        return None
    fastest = np.array([float(transfer[nbytes == b].min()) for b in sizes.tolist()])
    slope, alpha = np.polyfit(sizes.astype(np.float64), fastest, 1)
    if slope <= 0 or alpha < 0:
        return None
    return float(1.0 / slope)


@dataclass(frozen=True)
class ReductionLoad:
    """Per step (means over the steps with backward compute): the time the gradient reduce-scatters' bytes take at
    their group's reference rate (`ReductionRates`: what no bucket size shortens; NCCL's per-call latency, which
    larger buckets do save, and the waits for peers left out) against the backward compute on the compute stream
    (busy time)."""

    transfer_us: float
    backward_us: float

    @property
    def ratio(self) -> float:
        return self.transfer_us / self.backward_us if self.backward_us > 0 else float("inf")


def reduction_load(view: RankFacts) -> ReductionLoad | None:
    """The rank's `ReductionLoad`, or None without backward compute or gradient reductions in its steps, or when
    a reduce-scatter's size or its group's reference rate is unknown. At a ratio above 1 the reductions cannot
    keep up with backward at this bandwidth, whatever their bucket size."""
    return view.memo("reduction_load", _reduction_load)


def _reduction_load(view: RankFacts) -> ReductionLoad | None:
    g = view.gpu
    phase = phase_of(view.model, view.launch, phase_windows(view.model))
    backward = np.flatnonzero(view.is_compute & (g.stream == view.compute_stream) & (phase == PHASES.index("backward")))
    grads = np.flatnonzero(view.is_comm & (g.coll == RS) & (view.gpu_step >= 0))
    rates = reduction_rates(view)
    if not len(backward) or not len(grads) or not set(g.pg[grads].tolist()) <= set(rates.reference):
        return None  # without sizes or a reference rate, latency cannot be told from bytes
    if not np.isin(grads, rates.rows).all():
        return None
    least = rates.nbytes / np.array([rates.reference.get(int(p), np.inf) for p in g.pg.tolist()])
    by_step = view.group_by_step(grads)
    pairs = [
        (float(least[by_step[step]].sum()), iv.length(iv.union(g.start[rows], g.end[rows])))
        for step, rows in view.group_by_step(backward).items()
        if step in by_step
    ]
    if not pairs:
        return None
    return ReductionLoad(
        round(sum(p[0] for p in pairs) / len(pairs), 3), round(sum(p[1] for p in pairs) / len(pairs), 3)
    )
