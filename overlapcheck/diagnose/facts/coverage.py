"""What the findings of one rank explain of its exposed communication, and what nobody explains.

All sets are windows of the rank's own trace time. `E`, the exposed communication, is the union of the
communication kernels a profiled step issued minus `P` (the union of compute kernels), as in docs/metrics.md.
Part of it every ZeRO-3 (and DDP) schedule has, whatever the config: the wait for each step's first all-gather
(nothing ran before it to hide behind) and the last gradient bucket's reduction after the last backward kernel.
A finding explains the part of E its windows cover (`Finding.covers`, counted once where findings overlap); of
the rest, the inherent part is no one's fault, and what is left is unexplained.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.activities import PHASES, phase_of, phase_windows
from overlapcheck.diagnose.facts.sizing import RS
from overlapcheck.model import Finding
from overlapcheck.trace import classify as C

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

AR = C.COLLECTIVES.index("all_reduce")


@dataclass(frozen=True)
class Coverage:
    """One rank's exposed communication split three ways (µs per profiled step), and the unexplained windows."""

    exposed_us: float
    inherent_us: float
    explained_us: float  # covered by at least one finding
    unexplained: iv.Intervals

    @property
    def unexplained_us(self) -> float:
        return max(0.0, self.exposed_us - self.inherent_us - self.explained_us)


def exposed_windows(view: RankFacts) -> iv.Intervals:
    """E: the communication kernels issued inside a profiled step (all of them without steps), minus P."""
    g = view.gpu
    sel = view.is_comm & ((view.gpu_step >= 0) if len(view.model.steps) else True)
    return iv.subtract(iv.union(g.start[sel], g.end[sel]), view.compute)


def inherent_windows(view: RankFacts) -> iv.Intervals:
    """The exposed communication no schedule hides: the part of each step's first all-gather that compute waits
    for in any configuration (RankFacts.first_gather_waits), and per step the gradient reductions once backward
    compute has ended (the last bucket, flushed by the epilogue, and the reductions still queued on the stream
    then): the step's reduce-scatters (its all-reduces when it has none, as in DDP) after the end of the last
    compute-stream kernel its backward pass issued; without backward ops in the trace, the last-ending one when
    no compute of the step starts after it."""
    g = view.gpu
    inherent = view.first_gather_waits
    phase = phase_of(view.model, view.launch, phase_windows(view.model))
    # on the compute stream: the bucket's own kernels (scaling, copies) run on the reduction stream
    backward = np.flatnonzero(view.is_compute & (g.stream == view.compute_stream) & (phase == PHASES.index("backward")))
    backward_end = {step: float(g.end[rows].max()) for step, rows in view.group_by_step(backward).items()}
    for kind in (RS, AR):
        grads = np.flatnonzero(view.is_comm & (g.coll == kind) & (view.gpu_step >= 0))
        for step, rows in view.group_by_step(grads).items():
            if kind == AR and ((g.coll[view.step_rows[step]] == RS) & view.is_comm[view.step_rows[step]]).any():
                continue  # ZeRO's all-reduces (gradient norm, overflow check) are not gradient buckets
            last = rows[np.argmax(g.end[rows])]
            if step not in backward_end and _compute_after(view, step, float(g.end[last])):
                continue  # no backward ops to tell, and compute of the step follows it: not the step's tail
            lo = backward_end.get(step, float(g.start[last]))
            tail = iv.clip(iv.union(g.start[rows], g.end[rows]), lo, float(g.end[last]))
            inherent = iv.combine(inherent, tail)
    return iv.subtract(inherent, view.compute)


def _compute_after(view: RankFacts, step: int, t: float) -> bool:
    """Whether a compute kernel of `step` starts at or after `t`."""
    rows = view.step_rows.get(step)
    return rows is not None and bool((view.is_compute[rows] & (view.gpu.start[rows] >= t)).any())


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
    inherent = iv.intersect(rest, iv.combine(inherent_windows(view), limited))
    n = view.n_steps
    return Coverage(
        exposed_us=iv.length(exposed) / n,
        inherent_us=iv.length(inherent) / n,
        explained_us=iv.length(explained) / n,
        unexplained=iv.subtract(rest, inherent),
    )
