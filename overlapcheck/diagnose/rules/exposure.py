"""Exposed communication that no rule explains: located by collective, phase and the call site that issued it.

Precondition: after every other rule of the rank, the exposed communication that no finding covers and that
is not inherent (facts/coverage.py) is at least `UNEXPLAINED.min_share` of the step. It names where that time is, not
why: the cause is one no rule knows (or a rule's precondition did not hold), so it has no fix.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.activities import PHASES, phase_of, phase_windows
from overlapcheck.diagnose.facts.coverage import FAR_SLOWER, Coverage
from overlapcheck.diagnose.facts.job import JobFacts
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.finding import finding
from overlapcheck.diagnose.locators import exposed_blames
from overlapcheck.diagnose.rule import WARNING_SHARE, Rule
from overlapcheck.model import Finding
from overlapcheck.trace import classify as C

TOP_LOCATIONS = 5
OPTIMIZER_OP = "Optimizer.step#"


def unexplained_exposure(view: RankFacts, cov: Coverage) -> list[Finding]:
    """One finding for the rank's unexplained exposed communication, with its largest locations."""
    cost = cov.unexplained_us
    if cost <= 0 or cost < UNEXPLAINED.min_share * view.step_time_us:
        return []
    locations = _locations(view, cov.unexplained)
    top = locations[0] if locations else {"collective": "communication", "phase": None, "call_site": None}
    where = f" in {top['phase']}" if top["phase"] else ""
    site = f" (issued at {top['call_site']})" if top["call_site"] else ""
    evidence = {
        "exposed_us_per_step": round(cov.exposed_us, 3),
        "explained_us_per_step": round(cov.explained_us, 3),
        "inherent_us_per_step": round(cov.inherent_us, 3),
        "unexplained_us_per_step": round(cost, 3),
        "by_location": locations[:TOP_LOCATIONS],
    }
    return [
        finding(
            UNEXPLAINED.id,
            f"Exposed {top['collective']}{where} that no rule explains",
            f"{cost / 1000:.2f} ms per step of communication{site} runs with no compute beside it, and no rule's "
            "precondition holds for it: it is not the first all-gather or last gradient bucket (those are "
            "inherent), no host sync, stream wait, straggler or bucket setting accounts for it; look at it on the "
            "timeline (is it issued late, larger than the compute beside it, or waiting for a peer?)",
            cost,
            [view.rank_id],
            view.step_numbers,
            evidence,
            covers=cov.unexplained,
        )
    ]


def _locations(view: RankFacts, unexplained: iv.Intervals) -> list[dict[str, Any]]:
    """The unexplained time per (collective, phase, call site), largest first (µs per step; where two
    collectives overlap, each gets its share of the time they share)."""
    g = view.gpu
    rows = np.flatnonzero(view.is_comm & ((view.gpu_step >= 0) if len(view.model.steps) else True))
    if not len(rows):
        return []
    part = view.covered(g.end[rows], unexplained) - view.covered(g.start[rows], unexplained)
    keep = part > 0
    rows, part = rows[keep], part[keep]
    if not len(rows):
        return []
    total = iv.length(unexplained)
    part = part * (total / part.sum())  # overlapping collectives share the time they overlap
    phases = _phases(view, rows)
    sites = view.callsites
    grouped: dict[tuple[str, str | None, str | None], float] = defaultdict(float)
    for r, p, phase in zip(rows.tolist(), part.tolist(), phases, strict=True):
        thread = int(view.launch_thread[r])
        site = sites.site(thread, float(view.launch[r])).get("frame") if thread >= 0 else None
        grouped[(C.COLLECTIVES[int(g.coll[r])], phase, site if isinstance(site, str) else None)] += p
    ranked = sorted(grouped.items(), key=lambda item: -item[1])
    return [
        {"collective": kind, "phase": phase, "call_site": site, "exposed_us_per_step": round(us / view.n_steps, 3)}
        for (kind, phase, site), us in ranked
    ]


def _phases(view: RankFacts, rows: np.ndarray) -> list[str | None]:
    """forward / backward / after backward / optimizer, by when the collective was issued (docs/metrics.md);
    `optimizer` when it was issued inside the optimizer's step (`Optimizer.step#...`)."""
    model = view.model
    index = phase_of(model, view.launch[rows], phase_windows(model))
    o = model.ops
    opt = np.flatnonzero(view.name_mask(o.name, lambda n: n.startswith(OPTIMIZER_OP)))
    spans = iv.union(o.start[opt], o.end[opt])
    t = view.launch[rows]
    k = np.searchsorted(spans.starts, t, side="right") - 1  # the latest optimizer step starting at or before t
    in_opt = (k >= 0) & (t < spans.ends[np.maximum(k, 0)]) if len(spans) else np.zeros(len(t), dtype=bool)
    out: list[str | None] = []
    for i, opt_hit in zip(index.tolist(), in_opt.tolist(), strict=True):
        if i < 0:
            out.append(None)
        elif PHASES[i] == "optimizer":
            out.append("optimizer" if opt_hit else "after backward")
        else:
            out.append(PHASES[i])
    return out


# after every per-rank rule, on the exposed communication their findings leave uncovered (facts/coverage.py);
# below WARNING_SHARE of the step it is not reported
UNEXPLAINED = Rule(
    "unexplained-exposure",
    residual=unexplained_exposure,
    severity_cap="warning",
    blame=exposed_blames,
    min_share=WARNING_SHARE,
    leftover=True,
)


def peer_waiting(facts: JobFacts) -> list[Finding]:
    """Waiting for peers inside the collectives each rank counted inherent (a step's first all-gather, its last
    gradient bucket): a collective's kernels end together on every rank, so its shortest duration across ranks
    is the transfer, and what a rank's kernel lasts beyond that is waiting for a peer that arrived later. Only the
    transfer is inherent; the rest is someone's (a straggler, a slow node), whoever it is. Collectives are
    matched by key (process group, kind, order) on every rank, with the same size where the sizes are known."""
    results = facts.results
    sigs = {
        r.metrics.rank: r.signature
        for r in results
        if r.signature is not None and r.metrics.rank is not None and r.signature.inherent_parts_us
    }
    if len(sigs) < 2:
        return []
    best: dict[str, float] = {}
    size: dict[str, set[int]] = defaultdict(set)
    seen: dict[str, int] = defaultdict(int)
    for sig in sigs.values():
        for i, key in enumerate(sig.keys):
            best[key] = min(best.get(key, float("inf")), sig.dur[i])
            seen[key] += 1
            if sig.bytes:
                size[key].add(sig.bytes[i])
    waits: dict[int, float] = {}
    by_kind: dict[str, list[float]] = defaultdict(list)
    for rank, sig in sigs.items():
        total = 0.0
        for i, key in enumerate(sig.keys):
            part = sig.inherent_parts_us[i]
            if part <= 0 or seen[key] < len(sigs) or len(size[key]) > 1:
                continue
            # the transfer is the end of the kernel: what was counted inherent before its last best[key] µs, when
            # the kernel is far slower than the same collective on the rank that arrived last
            if sig.dur[i] <= FAR_SLOWER * best[key]:
                continue
            extra = max(0.0, part - best[key])
            total += extra
            by_kind[key.rsplit("|", 2)[-2]].append(extra / max(1, sig.steps))
        waits[rank] = total / max(1, sig.steps)
    waiting = sorted(rank for rank, us in waits.items() if us > 0)
    # the mean over the ranks that wait, as for a finding merged across ranks
    cost = statistics.fmean(waits[r] for r in waiting) if waiting else 0.0
    step_us = statistics.median(
        [r.metrics.step_time_us / max(1, len(r.metrics.steps)) for r in results if r.metrics.step_time_us]
    )
    if cost <= 0 or cost < PEER_WAIT.min_share * step_us:
        return []
    kinds = {kind: round(sum(v) / len(waiting), 3) for kind, v in sorted(by_kind.items()) if sum(v) > 0}
    top = max(kinds, key=kinds.__getitem__)
    evidence = {
        "wait_us_per_step": {
            "min": round(min(waits.values()), 3),
            "median": round(statistics.median(waits.values()), 3),
            "max": round(max(waits.values()), 3),
        },
        "by_kind_us_per_step": kinds,
        "ranks_waiting": len(waiting),
        "method": "per collective: kernel duration beyond the shortest duration of the same collective across "
        "ranks (its transfer), of the part each rank counted inherent",
    }
    return [
        finding(
            PEER_WAIT.id,
            f"Ranks wait for their peers inside the first all-gathers and last gradient buckets ({top})",
            f"{cost / 1000:.2f} ms per step (mean of the {len(waiting)} waiting ranks) of the collectives every step "
            "must expose (its first all-gather, its last gradient bucket) is not transfer but waiting: the same "
            "collective takes that much less on the rank that arrives last. Only the transfer is inherent; find who "
            "arrives late (a straggler, a slow node, a late host) on the timeline",
            cost,
            waiting,
            sorted({s.step for r in results for s in r.metrics.steps}),
            evidence,
            covers={rank: us for rank, us in waits.items() if us > 0},
        )
    ]


# across ranks, on the part each rank counted inherent (its covers are not in the ranks' unexplained exposure)
PEER_WAIT = Rule("peer-wait", cross=peer_waiting, severity_cap="warning", min_share=WARNING_SHARE, from_inherent=True)
