"""Diagnosis: turn the measured trace into findings (what blocks the overlap, its cost, the fix).

`diagnose_rank` runs where one rank's TraceModel is held (a worker process): the per-rank rules of
`registry.RULES` over that rank's facts. `merge_findings` runs once over every rank's result: it merges the same
finding across ranks, adds the cross-rank findings, sets severities and ranks them by cost. Rules: docs/rules.md.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.registry import BY_ID, INHERENT_MIN_US, RULES, Rule
from overlapcheck.diagnose.rules.stragglers import collective_signature
from overlapcheck.job import JobContext
from overlapcheck.model import SEVERITIES, Blame, CollectiveSignature, Finding, Fix, RankMetrics, RankResult
from overlapcheck.trace.model import TraceModel


def diagnose_rank(
    model: TraceModel, metrics: RankMetrics, job: JobContext
) -> tuple[list[Finding], CollectiveSignature | None]:
    """The findings on one rank's trace (severity against that rank's own step), and its collective signature
    for the cross-rank rules."""
    return _diagnose(RankFacts(model, metrics, job))


def diagnose_rank_located(
    model: TraceModel, metrics: RankMetrics, job: JobContext
) -> tuple[list[Finding], CollectiveSignature | None, list[Blame]]:
    """`diagnose_rank`, plus the host events each finding blames (for the timelines: diagnose/locate.py)."""
    from overlapcheck.diagnose.locate import blamed_events

    facts = RankFacts(model, metrics, job)
    findings, signature = _diagnose(facts)
    return findings, signature, blamed_events(facts, findings)


def _diagnose(facts: RankFacts) -> tuple[list[Finding], CollectiveSignature | None]:
    found: list[Finding] = []
    for rule in RULES:
        if rule.find is None:
            continue
        # DeepSpeed always has the inherent syncs: report them only when they cost something
        found.extend(f for f in rule.find(facts) if not (rule.inherent and f.cost_us < INHERENT_MIN_US))
    found = _apply_claims(found)
    step_us = facts.step_time_us
    return [_with_severity(f, step_us) for f in found], collective_signature(facts)


def _apply_claims(findings: list[Finding]) -> list[Finding]:
    """Subtract from a finding's cost what a more specific finding on the same rank already explains."""
    out = []
    for claimed in findings:
        cost = claimed.cost_us
        for claimant in findings:
            if claimed.rule in BY_ID[claimant.rule].explains:
                cost = round(max(0.0, cost - claimant.cost_us), 3)
        out.append(dataclasses.replace(claimed, cost_us=cost) if cost != claimed.cost_us else claimed)
    return out


def severity_of(cost_us: float, step_us: float, rule: Rule) -> str:
    """critical / warning / info from the share of the step a finding costs, never above the rule's cap."""
    share = cost_us / step_us if step_us > 0 else 0.0
    level = "critical" if share >= rule.shares[0] else "warning" if share >= rule.shares[1] else "info"
    cap = rule.severity_cap
    if cap is not None and SEVERITIES.index(cap) > SEVERITIES.index(level):
        return cap
    return level


def _with_severity(f: Finding, step_us: float) -> Finding:
    return dataclasses.replace(f, severity=severity_of(f.cost_us, step_us, BY_ID[f.rule]))


def merge_findings(results: Sequence[RankResult], job: JobContext) -> tuple[list[Finding], float | None]:
    """Merge per-rank findings across ranks, add cross-rank findings, rank them by cost.

    `results` in rank order. Returns the findings and the share of exposed communication they explain."""
    groups: dict[tuple[str, tuple[object, ...]], list[Finding]] = {}
    for r in results:
        for f in r.findings:
            key = tuple(repr(f.evidence.get(field)) for field in BY_ID[f.rule].distinct_by)
            groups.setdefault((f.rule, key), []).append(f)
    merged = [
        m
        for m in (_merge(group) for group in groups.values())
        if not BY_ID[m[0].rule].inherent or m[0].cost_us >= INHERENT_MIN_US
    ]
    for rule in RULES:
        if rule.cross is not None:
            merged.extend((f, {}) for f in rule.cross(results, job))
    findings = _paced_by_straggler(merged)
    findings = [_drop_applied(f, job) for f in findings]
    ranks = [r.metrics for r in results]
    step_us = _mean([r.step_time_us / max(1, len(r.steps)) for r in ranks if r.step_time_us])
    findings = [_with_severity(f, step_us) for f in findings]
    findings.sort(key=lambda f: (-f.cost_us, f.rule))
    return findings, _explained(ranks, findings)


RankCosts = dict[int, float]  # rank -> that rank's cost of one merged finding


def _merge(group: list[Finding]) -> tuple[Finding, RankCosts]:
    """One finding from the same rule on several ranks: mean cost over the ranks that show it, the evidence of
    the rank where it costs most, and the spread of costs across ranks."""
    worst = max(group, key=lambda f: f.cost_us)
    costs = {r: f.cost_us for f in group for r in f.ranks}
    evidence = dict(worst.evidence)
    if len(costs) > 1:
        values = sorted(costs.values())
        evidence["cost_us_across_ranks"] = {
            "min": values[0],
            "median": statistics.median(values),
            "max": values[-1],
            "worst_rank": max(costs, key=costs.__getitem__),
        }
    merged = dataclasses.replace(
        worst,
        cost_us=round(_mean(list(costs.values())), 3),
        ranks=sorted(costs),
        steps=sorted({s for f in group for s in f.steps}),
        evidence=evidence,
    )
    return merged, costs


def _paced_by_straggler(findings: list[tuple[Finding, RankCosts]]) -> list[Finding]:
    """With a straggler, every collective waits for it, so the step runs at the straggler's pace: a per-rank
    cause costs the job what it costs on the straggler's rank. Elsewhere its measured cost includes the time
    that rank waits inside collectives for the straggler, which the straggler finding already counts."""
    slow = next((f.ranks[0] for f, _ in findings if f.rule == "straggler" and f.ranks), None)
    out = []
    for f, costs in findings:
        if slow is not None and slow in costs and len(costs) > 1:
            f = dataclasses.replace(f, cost_us=round(costs[slow], 3), evidence={**f.evidence, "cost_from_rank": slow})
        out.append(f)
    return out


def _explained(ranks: Sequence[RankMetrics], findings: list[Finding]) -> float | None:
    """Share of the exposed communication per step (mean over ranks) that the findings' costs account for."""
    exposed = _mean([r.exposed_per_step() for r in ranks if r.collectives["all"].count])
    if not exposed:
        return None
    explained = sum(f.cost_us for f in findings)
    return round(min(1.0, explained / exposed), 4)


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def _drop_applied(f: Finding, job: JobContext) -> Finding:
    """Remove from a fix what the job already has: an upgrade to a DeepSpeed it runs, an environment variable to
    unset that its environment does not set (when the job context records them)."""
    fix = f.fix
    upgrade = fix.upgrade
    wanted = upgrade.split(">=", 1)[1] if isinstance(upgrade, str) and upgrade.startswith("deepspeed>=") else None
    if wanted and job.deepspeed_version and _version(job.deepspeed_version) >= _version(wanted):
        upgrade = None
    env = fix.env
    if env is not None and job.env is not None:
        env = {k: v for k, v in env.items() if v is not None or k in job.env} or None
    if upgrade == fix.upgrade and env == fix.env:
        return f
    return dataclasses.replace(f, fix=Fix(config=fix.config, env=env, upgrade=upgrade))


def _version(text: str) -> tuple[int, ...]:
    """'0.13.3' -> (0, 13, 3); stops at the first part that is not a number ('2.1.0+cu121' -> (2, 1, 0))."""
    out = []
    for part in text.split("+")[0].split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)
