"""Interval algebra on half-open intervals `[start, end)`, vectorized with numpy.

An `Intervals` value is a pair of float64 arrays (starts, ends) that are sorted, disjoint and non-empty: the
result of `union`. All set operations take and return that form; `length` is the measure |S|.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Intervals(NamedTuple):
    starts: np.ndarray
    ends: np.ndarray

    def __len__(self) -> int:
        return len(self.starts)


EMPTY = Intervals(np.zeros(0), np.zeros(0))


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """Merge arbitrary (possibly nested, overlapping, unsorted, zero-length) intervals into disjoint ones."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    keep = ends > starts
    if not keep.all():
        starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return EMPTY
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], np.maximum.accumulate(ends[order])
    # a new merged interval begins where a start lies beyond every end seen so far
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > e[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return Intervals(s[first], e[last])


def length(a: Intervals) -> float:
    """|A|: total covered time."""
    return float(np.sum(a.ends - a.starts)) if len(a) else 0.0


def combine(a: Intervals, b: Intervals) -> Intervals:
    """A ∪ B."""
    return union(np.concatenate([a.starts, b.starts]), np.concatenate([a.ends, b.ends]))


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """A ∩ B."""
    return _sweep(a, b, lambda ina, inb: ina & inb)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """A − B."""
    return _sweep(a, b, lambda ina, inb: ina & ~inb)


def intersection_length(a: Intervals, b: Intervals) -> float:
    """|A ∩ B| = |A| + |B'| − |A ∪ B'| (both already disjoint), B' = the part of B that can meet A."""
    if not len(a) or not len(b):
        return 0.0
    b = _window(b, a.starts[0], a.ends[-1])
    return length(a) + length(b) - length(combine(a, b)) if len(b) else 0.0


def clip(a: Intervals, lo: float, hi: float) -> Intervals:
    """A ∩ [lo, hi)."""
    return intersect(a, Intervals(np.array([lo]), np.array([hi])))


def _sweep(a: Intervals, b: Intervals, keep) -> Intervals:
    """Elementary segments between all boundaries of A and B, kept where keep(in_a, in_b), merged."""
    if not len(a):
        return EMPTY
    b = _window(b, a.starts[0], a.ends[-1])  # the rest of B cannot change A ∩ B or A − B
    bounds = np.unique(np.concatenate([a.starts, a.ends, b.starts, b.ends]))
    lo, hi = bounds[:-1], bounds[1:]
    ina = _covered(a, lo)
    inb = _covered(b, lo) if len(b) else np.zeros(len(lo), dtype=bool)
    mask = keep(ina, inb)
    return union(lo[mask], hi[mask])


def _window(b: Intervals, lo: float, hi: float) -> Intervals:
    """The intervals of B (sorted, disjoint) that meet [lo, hi): two binary searches, no copy."""
    i = int(np.searchsorted(b.ends, lo, side="right"))
    j = int(np.searchsorted(b.starts, hi, side="left"))
    return Intervals(b.starts[i:j], b.ends[i:j])


def _covered(a: Intervals, points: np.ndarray) -> np.ndarray:
    """Whether each point lies in A (A disjoint and sorted)."""
    i = np.searchsorted(a.starts, points, side="right") - 1
    ok = i >= 0
    out = np.zeros(len(points), dtype=bool)
    out[ok] = points[ok] < a.ends[i[ok]]
    return out
