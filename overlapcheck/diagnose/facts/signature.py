"""What the cross-rank rules need of one rank, measured where its trace is held: each collective's key, duration
and exposed fraction, and the host's lead-in to the steps (rules/stragglers.py, facts/hostgap.py)."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.bandwidth import group_sizes, message_bytes
from overlapcheck.diagnose.facts.hostgap import host_gap
from overlapcheck.model import CollectiveSignature
from overlapcheck.trace import classify as C

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts


def signature_rows(view: RankFacts) -> np.ndarray:
    """The GPU rows of the rank's collectives, in the signature's order (by start)."""
    g = view.gpu
    idx = np.flatnonzero(view.is_comm)
    return idx[np.argsort(g.start[idx], kind="stable")]


def per_collective(view: RankFacts, windows: iv.Intervals) -> list[float]:
    """Per collective of the signature, the µs of `windows` inside its kernel (rounded like the durations)."""
    idx = signature_rows(view)
    g = view.gpu
    part = view.covered(g.end[idx], windows) - view.covered(g.start[idx], windows)
    return np.round(part, 3).tolist()


def collective_signature(view: RankFacts) -> CollectiveSignature | None:
    """Per-rank data for the cross-rank rule: each collective's key, duration and exposed fraction, and the
    host's lead-in to the steps with the frames that spend it."""
    g = view.gpu
    idx = signature_rows(view)
    if not len(idx):
        return None
    dur = g.end[idx] - g.start[idx]
    exposed = np.where(dur > 0, view.idle(g.start[idx], g.end[idx]) / np.maximum(dur, 1e-9), 0.0)
    counters: Counter[tuple[int, int]] = Counter()
    keys = []
    for pg, coll in zip(g.pg[idx].tolist(), g.coll[idx].tolist(), strict=True):
        counters[(pg, coll)] += 1
        keys.append(f"{view.names[pg] if pg >= 0 else ''}|{C.COLLECTIVES[coll]}|{counters[(pg, coll)]}")
    gap = host_gap(view)
    return CollectiveSignature(
        keys=keys,
        dur=np.round(dur, 3).tolist(),
        exposed=np.round(exposed, 4).tolist(),
        in_step=(view.gpu_step[idx] >= 0).tolist(),
        steps=view.n_steps,
        bytes=message_bytes(view.model)[idx].tolist(),
        group=group_sizes(view.model)[idx].tolist(),
        host_gap_us=gap.us_per_step,
        host_gap_frames=[name for name, _ in gap.frames],
        host_gap_frame_us=[us for _, us in gap.frames],
    )
