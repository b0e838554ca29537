"""Where each finding happens: the host events a finding blames (its host syncs, the compute-stream waits it
reports, the late launches its syncs caused), for the timelines. Computed only when timelines are asked for,
from the same facts the rules read (facts/hostsyncs.py, facts/stalls.py)."""

from __future__ import annotations

import numpy as np

from overlapcheck.diagnose.facts.hostsyncs import OWNERS, STARVED_LAUNCH_US, starvation_windows
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.facts.waitsites import stalls_at
from overlapcheck.diagnose.registry import BY_ID
from overlapcheck.diagnose.rules.waits import not_prefetched_costs, wait_costs
from overlapcheck.model import Blame, Finding
from overlapcheck.trace import classify as C

MAX_BLAMES = 5_000  # blamed events kept per rank, the costliest first
SYNC_RULES = {rule for rule, _ in OWNERS}


def finding_key(f: Finding) -> str:
    """A finding's identity: its rule and the evidence fields that tell its findings apart (the same fields
    merge_findings merges by), so a rank's finding and the merged one share it."""
    return f.rule + "|" + "|".join(repr(f.evidence.get(name)) for name in BY_ID[f.rule].distinct_by)


def blamed_events(view: RankFacts, findings: list[Finding]) -> list[Blame]:
    """The host events each of `findings` (one rank's) blames, costliest first, at most MAX_BLAMES."""
    out: list[Blame] = []
    rules = {f.rule for f in findings}
    if rules & SYNC_RULES:
        out += _syncs(view, [f for f in findings if f.rule in SYNC_RULES])
    if "cross-stream-wait" in rules or "allgather-not-prefetched" in rules:
        out += _waits(view, findings)
    out.sort(key=lambda b: (-b.cost_us, b.start))
    return sorted(out[:MAX_BLAMES], key=lambda b: b.start)


def _tid(view: RankFacts, thread: int) -> int:
    threads = view.model.threads
    if 0 <= thread < len(threads):
        tid = threads[thread][1]
        return tid if isinstance(tid, int) else thread
    return -1


def _syncs(view: RankFacts, findings: list[Finding]) -> list[Blame]:
    sc = view.host_syncs
    by_owner: dict[tuple[str, str], str] = {}
    for f in findings:
        label = ""
        if f.rule == "host-sync":
            calls = f.evidence.get("calls") or [""]
            label = f"{calls[0]} @ {f.evidence.get('call_site')}"
        by_owner[(f.rule, label)] = finding_key(f)
    out: list[Blame] = []
    if not sc.syncs:
        return out
    steps = view.step_of(np.array([s.start for s in sc.syncs]))
    blamed: list[tuple[float, str, str, float]] = []  # (end, rule, key, cost) of the calls that cost something
    for i, (s, owner) in enumerate(zip(sc.syncs, sc.owners, strict=True)):
        key = by_owner.get(owner)
        if key is None:
            continue
        step = int(steps[i])
        cost = float(sc.cost[i])
        out.append(
            Blame(
                owner[0], key, "sync", s.start, s.end, _tid(view, s.thread), s.call, step if step >= 0 else None, cost
            )
        )
        if cost > 0:
            blamed.append((s.end, owner[0], key, cost))
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
        end, rule, key, cost = blamed[j]
        step = int(wsteps[k])
        start = max(w.start, min(end, w.end))
        out.append(
            Blame(
                rule,
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


def _waits(view: RankFacts, findings: list[Finding]) -> list[Blame]:
    st = view.stalls
    if not len(st.kernel):
        return []
    g = view.gpu
    kinds = np.where(st.comm >= 0, g.coll[np.maximum(st.comm, 0)], -1)
    steps = view.gpu_step[st.kernel]
    out: list[Blame] = []
    for f in findings:
        if f.rule == "cross-stream-wait":
            costs = wait_costs(view)
            name = f.evidence.get("waited_for")
            kind = C.COLLECTIVES.index(name) if name in C.COLLECTIVES else -1
            at_site = stalls_at(view, f.evidence.get("call_site"))
            sel = np.flatnonzero((kinds == kind) & at_site & (costs > 0))
        elif f.rule == "allgather-not-prefetched":
            mask, costs = not_prefetched_costs(view)
            sel = np.flatnonzero(mask)
            name = "all_gather (not prefetched)"
        else:
            continue
        key = finding_key(f)
        for r in sel.tolist():
            step = int(steps[r])
            out.append(
                Blame(
                    f.rule,
                    key,
                    "wait",
                    float(st.start[r]),
                    float(st.end[r]),
                    view.compute_stream,
                    f"compute stream waits for {name}",
                    step if step >= 0 else None,
                    float(costs[r]),
                )
            )
    return out
