"""The interval algebra against brute force on a fine grid."""

from __future__ import annotations

import numpy as np
import pytest

from overlapcheck.analysis import intervals as iv


def grid(starts, ends, n=64):
    cover = np.zeros(n, dtype=bool)
    for s, e in zip(starts, ends, strict=True):
        cover[int(s) : int(e)] = True
    return cover


def as_grid(a: iv.Intervals, n=64):
    return grid(a.starts, a.ends, n)


def test_union_merges_nested_overlapping_touching_and_drops_zero_length():
    u = iv.union([5, 0, 2, 10, 10, 20], [6, 4, 3, 15, 10, 25])
    assert u.starts.tolist() == [0, 5, 10, 20]
    assert u.ends.tolist() == [4, 6, 15, 25]
    assert iv.length(u) == 4 + 1 + 5 + 5


def test_touching_intervals_are_one_length():
    assert iv.length(iv.union([0, 5], [5, 10])) == 10


def test_empty_inputs():
    e = iv.union([], [])
    assert len(e) == 0 and iv.length(e) == 0
    a = iv.union([0], [3])
    assert iv.intersection_length(a, e) == 0
    assert iv.length(iv.subtract(a, e)) == 3
    assert len(iv.subtract(e, a)) == 0


@pytest.mark.parametrize("seed", range(40))
def test_operations_match_brute_force(seed):
    rng = np.random.default_rng(seed)

    def rand():  # noqa: E306
        s = rng.integers(0, 60, size=rng.integers(0, 8))
        return s, s + rng.integers(0, 10, size=len(s))

    (sa, ea), (sb, eb) = rand(), rand()
    a, b = iv.union(sa, ea), iv.union(sb, eb)
    ga, gb = grid(sa, ea, 80), grid(sb, eb, 80)
    assert as_grid(a, 80).tolist() == ga.tolist()
    assert iv.length(a) == ga.sum()
    assert as_grid(iv.intersect(a, b), 80).tolist() == (ga & gb).tolist()
    assert as_grid(iv.subtract(a, b), 80).tolist() == (ga & ~gb).tolist()
    assert as_grid(iv.combine(a, b), 80).tolist() == (ga | gb).tolist()
    assert iv.intersection_length(a, b) == (ga & gb).sum()
    assert iv.length(iv.clip(a, 10, 30)) == ga[10:30].sum()
