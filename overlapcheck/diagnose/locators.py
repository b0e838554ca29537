"""How the events a finding blames are found on one rank, for the timelines (`Rule.blame`): shared locators that
several rules use. A locator gets every finding of the rank whose rule uses it, each with its rule, and returns
their blamed events; the rules' own locators live beside them (rules/waits.py). Computed only when timelines are
asked for, from the same facts the rules read."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts.hostsyncs import STARVED_LAUNCH_US, starvation_windows
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.model import Blame, Finding
from overlapcheck.trace import classify as C

if TYPE_CHECKING:
    from overlapcheck.diagnose.rule import Rule

Located = list[tuple["Rule", Finding]]
Locator = Callable[[RankFacts, Located], list[Blame]]


def thread_id(view: RankFacts, thread: int) -> int:
    """The trace's tid of a thread index of the model (-1 when unknown)."""
    threads = view.model.threads
    if 0 <= thread < len(threads):
        tid = threads[thread][1]
        return tid if isinstance(tid, int) else thread
    return -1


def sync_blames(view: RankFacts, located: Located) -> list[Blame]:
    """The host syncs of the sync rules' findings, and the late launches they caused: the compute stream idled
    until the host launched its next activity, after a blamed call returned."""
    sc = view.host_syncs
    by_owner: dict[tuple[str, str], tuple[str, str]] = {}  # (origin, label) -> (rule id, finding key)
    for rule, f in located:
        if rule.owns is None:
            continue
        label = ""
        if rule.distinct_by:  # syncs of no known origin: one finding per call and call site
            calls = f.evidence.get("calls") or [""]
            label = f"{calls[0]} @ {f.evidence.get('call_site')}"
        by_owner[(rule.owns.name, label)] = (rule.id, rule.key(f))
    out: list[Blame] = []
    if not sc.syncs:
        return out
    steps = view.step_of(np.array([s.start for s in sc.syncs]))
    blamed: list[tuple[float, str, str, float]] = []  # (end, rule, key, cost) of the calls that cost something
    for i, (s, owner) in enumerate(zip(sc.syncs, sc.owners, strict=True)):
        found = by_owner.get(owner)
        if found is None:
            continue
        rule_id, key = found
        step = int(steps[i])
        cost = float(sc.cost[i])
        tid = thread_id(view, s.thread)
        out.append(Blame(rule_id, key, "sync", s.start, s.end, tid, s.call, step if step >= 0 else None, cost))
        if cost > 0:
            blamed.append((s.end, rule_id, key, cost))
    if not blamed:
        return out
    blamed.sort()
    ends = np.array([b[0] for b in blamed])
    windows = starvation_windows(view)
    launch = np.array([w.launch for w in windows])
    if not len(windows):
        return out
    # a late launch: the compute stream idled until the host launched its next activity, after a blamed call
    # returned (within STARVED_LAUNCH_US before the idle began, or inside it); the event runs from the later of
    # the idle's start and the call's return to the launched activity's start, at the call's cost
    last = np.searchsorted(ends, launch, side="right") - 1
    lo = np.array([w.start for w in windows]) - STARVED_LAUNCH_US
    wsteps = view.step_of(launch)
    for k, w in enumerate(windows):
        j = int(last[k])
        if j < 0 or ends[j] < lo[k]:
            continue
        end, rule_id, key, cost = blamed[j]
        step = int(wsteps[k])
        start = max(w.start, min(end, w.end))
        out.append(
            Blame(
                rule_id,
                key,
                "late-launch",
                start,
                w.end,
                view.compute_stream,
                f"compute idle until the next launch, {w.end - start:.1f} µs after the call returned",
                step if step >= 0 else None,
                cost,
            )
        )
    return out


def exposed_blames(view: RankFacts, located: Located) -> list[Blame]:
    """The exposed communication a finding charges: each communication kernel of the rank where it ran alone
    inside the finding's windows (`Finding.covers`), on its stream, with the exposed µs it has there."""
    g = view.gpu
    rows = np.flatnonzero(view.is_comm)
    out: list[Blame] = []
    if not len(rows):
        return out
    steps = view.gpu_step[rows]
    for rule, f in located:
        if not isinstance(f.covers, iv.Intervals) or not len(f.covers):
            continue
        exposed = iv.subtract(f.covers, view.compute)
        part = view.covered(g.end[rows], exposed) - view.covered(g.start[rows], exposed)
        key = rule.key(f)
        for n in np.flatnonzero(part > 0).tolist():
            r = int(rows[n])
            step = int(steps[n])
            out.append(
                Blame(
                    rule.id,
                    key,
                    "exposed",
                    float(g.start[r]),
                    float(g.end[r]),
                    int(g.stream[r]),
                    f"exposed {C.COLLECTIVES[int(g.coll[r])]}",
                    step if step >= 0 else None,
                    float(part[n]),
                )
            )
    return out
