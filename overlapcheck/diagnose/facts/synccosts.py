"""What each host sync cost: its share of the starvation windows it returned in (facts/hostsyncs.py) plus what its
block delayed after it returned (facts/delays.py). Its own module because it reads both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.diagnose.facts.delays import host_delayed
from overlapcheck.diagnose.facts.hostsyncs import Origin, Owner, Sync, host_sync_list, window_costs

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.view import RankFacts


@dataclass(frozen=True)
class SyncCosts:
    """Every candidate blocking call of a rank (`host_sync_list`), its owner, and what it cost: `cost` is the
    share of the starvation windows it returned in (`chain_costs`) plus `stall_cost`, what its block delayed
    after it returned: compute stalls on collectives its thread issued late and later starvation (facts/delays.py);
    calls that waited for no GPU work cost nothing."""

    syncs: list[Sync]
    owners: list[Owner]
    cost: np.ndarray
    boundary: np.ndarray  # the step whose boundary window each call delayed, -1 inside a step
    stall_cost: np.ndarray  # the part of `cost` from what the call delayed after it returned (facts/delays.py)
    windows: list[list[tuple[float, float]]]  # per call: where the compute idle it is charged for lies

    def owned_by(self, origin: Origin) -> list[tuple[Owner, np.ndarray]]:
        """The owners of one origin with a call that waited for GPU work, in order of their first call, each with
        the indices of all its calls (those that returned without waiting included, for the evidence)."""
        out = []
        for owner in dict.fromkeys(o for o in self.owners if o[0] == origin.name):
            idx = np.array([i for i, o in enumerate(self.owners) if o == owner])
            if any(self.syncs[i].waited for i in idx.tolist()):
                out.append((owner, idx))
        return out


def sync_costs(view: RankFacts) -> SyncCosts:
    """The host syncs of the rank with their owners and costs (computed once per rank). Only the calls that
    waited for GPU work are charged; each stall on a collective a call's block delayed is charged to that call,
    once (facts/delays.py)."""
    syncs = host_sync_list(view)
    wc = window_costs(view)
    windows = [list(w) for w in wc.windows]
    stall_cost = np.zeros(len(syncs))
    delays = host_delayed(view)
    for n in np.flatnonzero(delays.sync >= 0).tolist():
        i = int(delays.sync[n])
        stall_cost[i] += delays.explained[n]
        windows[i].append((float(delays.start[n]), float(delays.end[n])))
    for i, part, a, b in zip(
        delays.window_sync.tolist(),
        delays.window_cost.tolist(),
        delays.window_start.tolist(),
        delays.window_end.tolist(),
        strict=True,
    ):
        stall_cost[i] += part
        windows[i].append((a, b))
    return SyncCosts(syncs, wc.owners, wc.cost + stall_cost, wc.boundary, stall_cost, windows)
