"""Name each communication kernel's collective by the op that launched it.

The kernel name is a poor witness: older NCCL and sub-sampled traces run every collective as
`ncclKernel_SendRecv` / `ncclDevKernel_Generic`, and all-to-all is send/recv underneath. The op that launched the
kernel says what the program asked for: the kernel's own `Collective name` arg (torch >= 2.2 copies it from
`record_param_comms`), else the innermost `nccl:*` / `c10d::*` / `gloo:*` op enclosing the kernel's launch on the
launching thread (its runtime call, found by correlation). The kernel name is the fallback.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.trace import classify as C

if TYPE_CHECKING:
    from overlapcheck.trace.model import Table

# where a communication kernel's collective kind came from (the GPU table's `kind_from`; -1: not communication)
KIND_FROM = ("kernel name", "launching op")
FROM_NAME, FROM_OP = 0, 1

_OP_PREFIX = re.compile(r"^(?:nccl:|c10d::|gloo:)")
_INDEX = {kind: i for i, kind in enumerate(C.COLLECTIVES)}


def op_collective(name: str) -> str | None:
    """The collective an op names: `nccl:_all_gather_base` -> all_gather, `c10d::allreduce_` -> all_reduce,
    `c10d::alltoall_base_` -> all_to_all; None for other ops or one that names no known collective."""
    if not _OP_PREFIX.match(name):
        return None
    word = _OP_PREFIX.sub("", name).rstrip("_")
    return C.collective_from_arg(word)


def kinds_from_launch(names: list[str], gpu: Table, runtime: Table, ops: Table) -> np.ndarray:
    """Set, in place, each communication kernel's `coll` from its launching op where the kernel's own name would
    say otherwise; returns `kind_from` per GPU row (FROM_OP, FROM_NAME, or -1 for non-communication rows).

    A kernel whose kind differs from its name's got it from its `Collective name` arg: the launching op's record.
    Otherwise the innermost collective op around its launch decides, when it names a known collective."""
    kind_from = np.where(gpu.cls == C.COMM, FROM_NAME, -1).astype(np.int8)
    comm = np.flatnonzero(gpu.cls == C.COMM)
    if not len(comm):
        return kind_from
    by_name = np.array([_INDEX[C.collective_from_name(names[n])] if n >= 0 else -1 for n in gpu.name[comm].tolist()])
    from_arg = gpu.coll[comm] != by_name
    kind_from[comm[from_arg]] = FROM_OP
    rest = comm[~from_arg]
    if not len(rest) or not len(runtime) or not len(ops):
        return kind_from
    # the collective ops, by the kind they name
    op_kind = np.full(len(names), -1, dtype=np.int64)
    for n in np.unique(ops.name).tolist():
        kind = op_collective(names[n]) if n >= 0 else None
        if kind is not None:
            op_kind[n] = _INDEX[kind]
    coll_ops = np.flatnonzero(op_kind[ops.name] >= 0)
    if not len(coll_ops):
        return kind_from
    rest, launch = launches(rest, gpu, runtime)
    o_kind = op_kind[ops.name[coll_ops]]
    found = enclosing(
        runtime.start[launch], runtime.thread[launch], ops.start[coll_ops], ops.end[coll_ops], ops.thread[coll_ops]
    )
    inside = found >= 0
    gpu.coll[rest[inside]] = o_kind[found[inside]]
    kind_from[rest[inside]] = FROM_OP
    return kind_from


def launches(rows: np.ndarray, gpu: Table, runtime: Table) -> tuple[np.ndarray, np.ndarray]:
    """The GPU `rows` whose launching runtime call is in the trace (same correlation), and those calls' rows."""
    by_corr = np.argsort(runtime.correlation, kind="stable")
    corr_sorted = runtime.correlation[by_corr]
    corr = gpu.correlation[rows]
    pos = np.minimum(np.searchsorted(corr_sorted, corr), len(corr_sorted) - 1)
    ok = (corr >= 0) & (corr_sorted[pos] == corr)
    return rows[ok], by_corr[pos[ok]]


def enclosing(
    when: np.ndarray, thread: np.ndarray, s_start: np.ndarray, s_end: np.ndarray, s_thread: np.ndarray
) -> np.ndarray:
    """For each time `when` on `thread`: the index of the innermost scope (`s_*`, e.g. ops) on that thread around
    it, -1 for none. The latest scope that starts at or before `when` on the thread is the innermost one, when it
    has not ended before `when` (the scopes of one thread nest)."""
    thread, s_thread = thread.astype(np.int64), s_thread.astype(np.int64)
    order = np.lexsort((s_start, s_thread))
    key = s_thread[order]
    found = np.full(len(when), -1, dtype=np.int64)
    for t in np.unique(thread).tolist():
        lo, hi = np.searchsorted(key, t, "left"), np.searchsorted(key, t, "right")
        if lo == hi:
            continue
        mine = np.flatnonzero(thread == t)
        i = np.searchsorted(s_start[order[lo:hi]], when[mine], "right") - 1
        cand = order[lo + np.maximum(i, 0)]
        inside = (i >= 0) & (s_end[cand] >= when[mine])
        found[mine[inside]] = cand[inside]
    return found
