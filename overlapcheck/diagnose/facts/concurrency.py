"""Stream concurrency and shared communicators: whether two streams ever run at once and, when none do, whether
the trace shows the hardware queue serializing them (no explicit wait explains it); which process group
carries both all-gathers and reduce-scatters, and how long collectives queued behind each other on it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts import waitsites
from overlapcheck.diagnose.facts.sizing import AG, RS
from overlapcheck.diagnose.facts.stalls import DEPENDENCY_TOLERANCE_US, STALL_MIN_US, Stalls
from overlapcheck.trace import classify as C

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts

CONCURRENT_SHARE = 0.002  # below this share of busy time with two streams active, streams never overlap
# one hardware queue runs every kernel after all those launched before it; a few exceptions allow for launch
# times read on different host threads
LAUNCH_ORDER_SHARE = 0.95
# what serializes every stream: one hardware queue, or synchronous launches (the values that do it)
SERIALIZING_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "CUDA_LAUNCH_BLOCKING": "1"}


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


@dataclass(frozen=True)
class Serialization:
    """Why no two streams run at once: the serializations the trace shows, explained by an explicit stream wait
    (`cudaStreamWaitEvent`, facts/waitsites.py) or by nothing but launch order.

    A *stall* is a compute-stream stall (facts/stalls.py) on an activity launched before the stalled one; a
    *held collective* is a collective off the compute stream that started only when an activity launched before
    it on another stream (compute, or the compute stream's) ended, later than its launch and its own stream
    allowed. Unexplained, both are what one hardware queue does (kernels run in launch order across streams);
    explained, they are the program's dependencies. The queue is the explanation when the unexplained ones
    outnumber the stalls the waits explain (a collective held after a wait for that compute is the program's
    order in any configuration, so it weighs neither way) and they cost compute time."""

    explained_stalls: int
    unexplained_stalls: int  # in launch order, no wait made them wait
    explained_held: int
    unexplained_held: int
    unexplained_cost_us: float  # per step: stall idle the unexplained serializations account for
    env: dict[str, str]  # the serializing variables the job's environment sets (when it records one)
    held: np.ndarray  # GPU rows of the unexplained held collectives
    stall_unexplained: np.ndarray  # per stall: in launch order with no wait
    launch_order: float | None = None  # launch_order_share: kernels that ran after all those launched before

    @property
    def unexplained(self) -> int:
        return self.unexplained_stalls + self.unexplained_held

    @property
    def explained(self) -> int:
        return self.explained_stalls

    @property
    def hardware_queue(self) -> bool:
        """The hardware-queue explanation is founded: the job sets a serializing variable, or the kernels ran in
        launch order (nearly all of them after every kernel launched before them had ended, what one queue does),
        most serializations have no explicit wait behind them and they cost compute time."""
        if self.env:
            return True
        in_order = self.launch_order is None or self.launch_order >= LAUNCH_ORDER_SHARE
        return in_order and self.unexplained > self.explained and self.unexplained_cost_us > 0


def launch_order_share(view: RankFacts) -> float | None:
    """Of the kernels with a kernel launched before them, the share that started only after every kernel
    launched before them, on any stream, had ended (within DEPENDENCY_TOLERANCE_US): what one hardware queue
    does to every kernel, and concurrent streams to few. Launch order is the runtime call's time (by
    correlation); kernels whose call is not in the trace are left out. None when fewer than two are left."""
    g = view.gpu
    rows = np.flatnonzero((g.cls == C.COMPUTE) | (g.cls == C.COMM))
    rows = rows[view.launch_thread[rows] >= 0]
    if len(rows) < 2:
        return None
    rows = rows[np.lexsort((g.start[rows], view.launch[rows]))]
    before = np.maximum.accumulate(g.end[rows])[:-1]  # latest end among the kernels launched before each one
    after = g.start[rows[1:]] >= before - DEPENDENCY_TOLERANCE_US
    return round(float(after.mean()), 4)


def serialization(view: RankFacts) -> Serialization:
    return view.memo("serialization", _serialization)


def hardware_serialized(view: RankFacts) -> bool:
    """No two streams ever run at once, and the hardware queue, not the program's waits, is why."""
    return view.no_concurrency and serialization(view).hardware_queue


def serializing_env(view: RankFacts) -> dict[str, str]:
    """The variables of the job's environment (when the job context records it) that serialize streams."""
    env = view.job.env
    if env is None:
        return {}
    return {k: v for k, v in SERIALIZING_ENV.items() if str(env.get(k, "")) == v}


def _serialization(view: RankFacts) -> Serialization:
    st = view.stalls
    sw = waitsites.stall_waits(view)
    explained_stall = (sw.wait >= 0) & sw.known
    unexplained_stall = (sw.wait < 0) & sw.known & sw.in_launch_order
    held, held_explained = held_collectives(view)
    steps_ok = view.in_steps(view.launch[st.kernel]) if len(st.kernel) else np.zeros(0, dtype=bool)
    # a stall is the unexplained serialization's when no wait made it wait, or when what it waited for was a
    # collective that the queue held behind earlier compute
    owned = unexplained_stall | (np.isin(st.comm, held[~held_explained]) & (st.comm >= 0))
    cost = float(st.cost[owned & steps_ok].sum()) / view.n_steps
    return Serialization(
        explained_stalls=int(explained_stall.sum()),
        unexplained_stalls=int(unexplained_stall.sum()),
        explained_held=int(held_explained.sum()),
        unexplained_held=int((~held_explained).sum()),
        unexplained_cost_us=round(cost, 3),
        env=serializing_env(view),
        held=held[~held_explained],
        stall_unexplained=unexplained_stall,
        launch_order=launch_order_share(view),
    )


def held_collectives(view: RankFacts) -> tuple[np.ndarray, np.ndarray]:
    """Collectives off the compute stream that started only when an activity launched before them on another
    stream ended (compute, or on the compute stream), at least STALL_MIN_US after both their launch and their
    own stream allowed; and, for each, whether an explicit wait made its stream wait (issued on its launching
    thread, or recorded on its stream, after that activity's launch and before its own)."""
    rows, explained, _ = _held(view)
    return rows, explained


def default_stream_held(view: RankFacts) -> np.ndarray:
    """GPU rows of the all-gathers held behind earlier-launched compute by a recorded wait (`Stream Wait Event`)
    that made their stream wait for the compute stream: issued from the default stream (ProcessGroupNCCL makes
    the NCCL stream wait for the caller's current stream; with overlap_comm false DeepSpeed's gather stream is
    the default stream), they start only when the compute launched before them ends, however early the host
    issued them. Late because of that wait, not for want of a prefetch."""
    return view.memo("default_stream_held", _default_stream_held)


def held_on_default(view: RankFacts) -> np.ndarray:
    """Per stall of `view.stalls`: it waits for an all-gather of `default_stream_held`, not the step's first
    (overlap-comm-disabled charges what that wait added, `default_stream_claims`; no gather rule does)."""
    st = view.stalls
    return (st.comm >= 0) & np.isin(st.comm, default_stream_held(view)) & ~np.isin(st.comm, view.step_first_gathers)


def default_stream_claims(view: RankFacts) -> np.ndarray:
    """Per stall of `view.stalls`: the part of its cost the default-stream wait added (`held_on_default`), at
    most how much later the gather started than its launch and its own stream allowed (the rest of its
    lateness, queued behind the gathers before it on its stream, is not that wait's)."""
    return view.memo("default_stream_claims", _default_stream_claims)


def _default_stream_claims(view: RankFacts) -> np.ndarray:
    st = view.stalls
    out = np.zeros(len(st.kernel))
    sel = held_on_default(view)
    if sel.any():
        c = st.comm[sel]
        ready = np.maximum(view.launch[c], previous_end_on_stream(view)[c])
        out[sel] = np.minimum(st.cost[sel], np.maximum(0.0, view.gpu.start[c] - ready))
    return out


def comm_wait_claims(view: RankFacts) -> np.ndarray:
    """Per stall of `view.stalls`: the part of its cost that a recorded wait of its all-gather's stream for another
    communication stream added. The gather started when a collective launched before it on that stream ended,
    STALL_MIN_US or more after its launch and its own stream allowed, and a wait (recorded on its stream, or
    issued on its launching thread, between that collective's launch and its own) names that stream: however
    early the host issued it, it could not start sooner. At most how much later it started than it was ready,
    less what the shared communicator already claimed of that lateness (the same window). Once per rank;
    cross-stream-wait owns it, and allgather-transfer-bound only the rest."""
    return _comm_waits(view)[0]


def comm_wait_blockers(view: RankFacts) -> np.ndarray:
    """Per stall of `view.stalls`: the GPU row of the collective whose end a recorded wait made its all-gather
    wait for (`comm_wait_claims`), -1 where none did."""
    return _comm_waits(view)[1]


def _comm_waits(view: RankFacts) -> tuple[np.ndarray, np.ndarray]:
    return view.memo("comm_waits", _comm_wait_claims)


def _comm_wait_claims(view: RankFacts) -> tuple[np.ndarray, np.ndarray]:
    st = view.stalls
    g = view.gpu
    out = np.zeros(len(st.kernel))
    blocker = np.full(len(st.kernel), -1, dtype=np.int64)
    sel = np.flatnonzero(st.comm >= 0)
    if not len(sel):
        return out, blocker
    c = st.comm[sel]
    sel, c = sel[g.coll[c] == AG], c[g.coll[c] == AG]
    late = g.start[c] - np.maximum(view.launch[c], previous_end_on_stream(view)[c])
    sel, c, late = sel[late >= STALL_MIN_US], c[late >= STALL_MIN_US], late[late >= STALL_MIN_US]
    others = np.flatnonzero(view.is_comm & (g.stream != view.compute_stream))
    if not len(sel) or not len(others):
        return out, blocker
    others = others[np.argsort(g.end[others], kind="stable")]
    ends = g.end[others]
    w = waitsites.waits(view)
    for i, row, gap in zip(sel.tolist(), c.tolist(), late.tolist(), strict=True):
        a = int(np.searchsorted(ends, g.start[row] - DEPENDENCY_TOLERANCE_US, side="left"))
        b = int(np.searchsorted(ends, g.start[row] + DEPENDENCY_TOLERANCE_US, side="right"))
        cand = others[a:b]
        cand = cand[(g.stream[cand] != g.stream[row]) & (view.launch[cand] <= view.launch[row])]
        if not len(cand):
            continue
        on = int(g.stream[cand[-1]])
        since = float(view.launch[cand].min())
        hit = waitsites.latest_wait(
            w, int(view.launch_thread[row]), int(g.stream[row]), since, float(view.launch[row]), on
        )
        if hit >= 0 and bool(np.isin(w.wait_on[hit], g.stream[cand])):
            out[i] = max(0.0, min(float(st.cost[i]), gap) - float(view.claimed_by_communicator[i]))
            blocker[i] = int(cand[g.stream[cand] == w.wait_on[hit]][-1])
    return out, blocker


def _default_stream_held(view: RankFacts) -> np.ndarray:
    rows, explained, wait_on = _held(view)
    sel = explained & (wait_on == view.compute_stream) & (view.gpu.coll[rows] == AG) if len(rows) else explained
    return rows[sel]


def _held(view: RankFacts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return view.memo("held_collectives", _held_collectives)


def _held_collectives(view: RankFacts) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`held_collectives`, and for each the stream the explaining wait's record says it waited for (-1: none,
    or no record)."""
    g = view.gpu
    comm = np.flatnonzero(view.is_comm & (g.stream != view.compute_stream))
    empty = np.zeros(0, dtype=np.int64)
    if not len(comm):
        return empty, np.zeros(0, dtype=bool), empty
    ready = np.maximum(view.launch[comm], previous_end_on_stream(view)[comm])
    comm = comm[g.start[comm] - ready >= STALL_MIN_US]
    blockers = np.flatnonzero(view.is_compute | (g.stream == view.compute_stream))
    if not len(comm) or not len(blockers):
        return empty, np.zeros(0, dtype=bool), empty
    blockers = blockers[np.argsort(g.end[blockers], kind="stable")]
    ends = g.end[blockers]
    lo = np.searchsorted(ends, g.start[comm] - DEPENDENCY_TOLERANCE_US, side="left")
    hi = np.searchsorted(ends, g.start[comm] + DEPENDENCY_TOLERANCE_US, side="right")
    w = waitsites.waits(view)
    threads = view.launch_thread
    has_records = bool((w.stream >= 0).any())
    rows, explained, waited_on = [], [], []
    for c, a, b in zip(comm.tolist(), lo.tolist(), hi.tolist(), strict=True):
        if threads[c] < 0 and not has_records:
            continue  # how it was launched is not in the trace: no telling whether something made it wait
        cand = blockers[a:b]
        cand = cand[(g.stream[cand] != g.stream[c]) & (view.launch[cand] <= view.launch[c])]
        if not len(cand):
            continue
        since = float(view.launch[cand].min())  # the widest window a wait could have been issued in
        on = int(g.stream[cand[-1]])
        hit = waitsites.latest_wait(w, int(threads[c]), int(g.stream[c]), since, float(view.launch[c]), on)
        # a wait for yet another stream (e.g. the NCCL stream waiting for the stream the caller is on) does not
        # make the collective wait for the compute that held it
        rows.append(c)
        explained.append(hit >= 0 and (w.wait_on[hit] < 0 or bool(np.isin(w.wait_on[hit], g.stream[cand]))))
        waited_on.append(int(w.wait_on[hit]) if hit >= 0 else -1)
    return np.array(rows, dtype=np.int64), np.array(explained, dtype=bool), np.array(waited_on, dtype=np.int64)


def serialized_delay(view: RankFacts, st: Stalls) -> np.ndarray:
    """For each stall: how long its collective waited behind a collective of another kind on the same
    communicator (it started as that one ended, later than its stream let it)."""
    g = view.gpu
    out = np.zeros(len(st.kernel))
    comm = np.flatnonzero(view.is_comm & (g.pg >= 0))
    if not len(comm):
        return out
    comm = comm[np.argsort(g.end[comm], kind="stable")]
    stream_end = previous_end_on_stream(view)
    comm_end = g.end[comm]
    for n, c in enumerate(st.comm.tolist()):
        if c < 0 or g.pg[c] < 0:
            continue
        a = np.searchsorted(comm_end, g.start[c] - DEPENDENCY_TOLERANCE_US, side="left")
        b = np.searchsorted(comm_end, g.start[c] + DEPENDENCY_TOLERANCE_US, side="right")
        near = comm[a:b]
        if not ((g.pg[near] == g.pg[c]) & (g.coll[near] != g.coll[c])).any():
            continue
        ready = max(float(view.launch[c]), float(stream_end[c]))
        out[n] = max(0.0, float(g.start[c]) - ready)
    return out


def previous_end_on_stream(view: RankFacts) -> np.ndarray:
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
    return iv.length(reduce_scatter_tail_windows(view, pg)) / view.n_steps


def reduce_scatter_tail_windows(view: RankFacts, pg: str) -> iv.Intervals:
    """The windows `reduce_scatter_tail_delay` measures: per step and stream, from the replayed end of the
    step's last reduce-scatter to its observed end."""
    g = view.gpu
    pg_index = view.model.name_index(pg)
    rs = view.is_comm & (g.coll == RS) & (g.pg == pg_index)
    starts: list[float] = []
    ends: list[float] = []
    for stream in np.unique(g.stream[rs]).tolist():
        rows = np.flatnonzero(g.stream == stream)
        rows = rows[np.argsort(g.start[rows], kind="stable")]
        ag_ends = np.sort(g.end[view.is_comm & (g.coll == AG) & (g.pg == pg_index)])
        prev_obs, prev_new = -np.inf, -np.inf
        last: dict[int, tuple[float, float]] = {}
        for r in rows.tolist():
            start = float(g.start[r])
            behind_ag = rs[r] and _ends_at(ag_ends, start)
            held_elsewhere = start > prev_obs + DEPENDENCY_TOLERANCE_US and not behind_ag
            ready = start if held_elsewhere else float(view.launch[r])
            new_start = max(ready, prev_new)
            prev_obs, prev_new = float(g.end[r]), new_start + float(g.end[r] - g.start[r])
            if rs[r]:
                last[int(view.gpu_step[r])] = (prev_new, float(g.end[r]))  # the step's last one wins
        for k, (new_end, end) in last.items():
            if end > new_end and (k >= 0 or not len(view.model.steps)):
                starts.append(new_end)
                ends.append(end)
    return iv.union(np.array(starts), np.array(ends))


def _ends_at(sorted_ends: np.ndarray, t: float) -> bool:
    i = np.searchsorted(sorted_ends, t)
    near = [sorted_ends[j] for j in (i - 1, i) if 0 <= j < len(sorted_ends)]
    return any(abs(e - t) <= DEPENDENCY_TOLERANCE_US for e in near)
