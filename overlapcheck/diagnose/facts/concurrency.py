"""Stream concurrency and shared communicators: whether two streams ever run at once, which process group
carries both all-gathers and reduce-scatters, and how long collectives queued behind each other on it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts.sizing import AG, RS
from overlapcheck.diagnose.facts.stalls import DEPENDENCY_TOLERANCE_US, Stalls

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

CONCURRENT_SHARE = 0.002  # below this share of busy time with two streams active, streams never overlap


def concurrency(view: RankFacts) -> tuple[float, float, int]:
    """(time with at least two streams busy, total per-stream busy time, streams with activity)."""
    g = view.gpu
    streams = np.unique(g.stream)
    per_stream = sum(iv.length(iv.union(g.start[g.stream == s], g.end[g.stream == s])) for s in streams.tolist())
    return per_stream - iv.length(iv.union(g.start, g.end)), per_stream, len(streams)


def no_concurrency(view: RankFacts) -> bool:
    """Several streams carry work, communication among it, yet no two streams ever run at once."""
    both, total, n = concurrency(view)
    comm_elsewhere = (view.is_comm & (view.gpu.stream != view.compute_stream)).any()
    return bool(n >= 2 and comm_elsewhere and total > 0 and both <= CONCURRENT_SHARE * total)


def serialized_delay(view: RankFacts, st: Stalls) -> np.ndarray:
    """For each stall: how long its collective waited behind a collective of another kind on the same
    communicator (it started as that one ended, later than its stream let it)."""
    g = view.gpu
    out = np.zeros(len(st.kernel))
    comm = np.flatnonzero(view.is_comm & (g.pg >= 0))
    if not len(comm):
        return out
    comm = comm[np.argsort(g.end[comm], kind="stable")]
    stream_end = _previous_end_on_stream(view)
    for n, c in enumerate(st.comm.tolist()):
        if c < 0 or g.pg[c] < 0:
            continue
        a = np.searchsorted(g.end[comm], g.start[c] - DEPENDENCY_TOLERANCE_US, side="left")
        b = np.searchsorted(g.end[comm], g.start[c] + DEPENDENCY_TOLERANCE_US, side="right")
        near = comm[a:b]
        if not ((g.pg[near] == g.pg[c]) & (g.coll[near] != g.coll[c])).any():
            continue
        ready = max(float(view.launch[c]), float(stream_end[c]))
        out[n] = max(0.0, float(g.start[c]) - ready)
    return out


def _previous_end_on_stream(view: RankFacts) -> np.ndarray:
    """End of the activity before each one on its own stream (-inf for the first)."""
    g = view.gpu
    order = np.lexsort((g.start, g.stream))
    prev = np.full(len(g), -np.inf)
    same = g.stream[order][1:] == g.stream[order][:-1]
    ends = g.end[order][:-1]
    prev[order[1:][same]] = ends[same]
    return prev


def claimed_by_specific(view: RankFacts, st: Stalls) -> np.ndarray:
    """Stall cost owned by the same-communicator rule (before the all-gather and generic wait rules)."""
    if not view.shared_communicator:
        return np.zeros(len(st.kernel))
    return np.minimum(st.cost, serialized_delay(view, st))


def shared_communicator(view: RankFacts) -> str | None:
    """The process group name that carries both all-gathers and reduce-scatters, if any."""
    g = view.gpu
    ag = set(g.pg[view.is_comm & (g.coll == AG) & (g.pg >= 0)].tolist())
    rs = set(g.pg[view.is_comm & (g.coll == RS) & (g.pg >= 0)].tolist())
    both = sorted(ag & rs)
    return view.names[both[0]] if both else None


def reduce_scatter_tail_delay(view: RankFacts, pg: str) -> float:
    """Per step: end of the last reduce-scatter minus its end when its stream is replayed without the waits
    behind all-gathers of the same communicator (other activities keep any wait that was not their stream)."""
    g = view.gpu
    pg_index = view.model.name_index(pg)
    rs = view.is_comm & (g.coll == RS) & (g.pg == pg_index)
    total = 0.0
    for stream in np.unique(g.stream[rs]).tolist():
        rows = np.flatnonzero(g.stream == stream)
        rows = rows[np.argsort(g.start[rows], kind="stable")]
        ag_ends = np.sort(g.end[view.is_comm & (g.coll == AG) & (g.pg == pg_index)])
        prev_obs, prev_new = -np.inf, -np.inf
        gain: dict[int, float] = {}
        for r in rows.tolist():
            start = float(g.start[r])
            behind_ag = rs[r] and _ends_at(ag_ends, start)
            held_elsewhere = start > prev_obs + DEPENDENCY_TOLERANCE_US and not behind_ag
            ready = start if held_elsewhere else float(view.launch[r])
            new_start = max(ready, prev_new)
            prev_obs, prev_new = float(g.end[r]), new_start + float(g.end[r] - g.start[r])
            if rs[r]:
                gain[int(view.gpu_step[r])] = float(g.end[r]) - prev_new  # the step's last one wins
        total += sum(max(0.0, v) for k, v in gain.items() if k >= 0 or not len(view.model.steps))
    return total / view.n_steps


def _ends_at(sorted_ends: np.ndarray, t: float) -> bool:
    i = np.searchsorted(sorted_ends, t)
    near = [sorted_ends[j] for j in (i - 1, i) if 0 <= j < len(sorted_ends)]
    return any(abs(e - t) <= DEPENDENCY_TOLERANCE_US for e in near)
