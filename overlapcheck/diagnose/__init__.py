"""Diagnosis: turn the measured trace into findings (what blocks the overlap, its cost, the fix).

`diagnose_rank` runs where one rank's TraceModel is held (a worker process): the per-rank rules of
`registry.RULES` over that rank's facts. `merge_findings` runs once over every rank's result: it merges the same
finding across ranks, adds the cross-rank findings, sets severities and ranks them by cost. Rules: docs/rules.md.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts.coverage import coverage
from overlapcheck.diagnose.facts.job import JobFacts
from overlapcheck.diagnose.facts.signature import collective_signature, per_collective
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.registry import BY_ID, INHERENT_MIN_US, LIMITS, RULES
from overlapcheck.diagnose.rule import GPU_FACTS, Rule
from overlapcheck.job import JobContext
from overlapcheck.model import SEVERITIES, Blame, CollectiveSignature, Finding, Fix, RankMetrics, RankResult
from overlapcheck.trace.model import TraceModel

if TYPE_CHECKING:
    from overlapcheck.analysis.modules import ModuleIndex


def diagnose_rank(
    model: TraceModel, metrics: RankMetrics, job: JobContext, modules: ModuleIndex | None = None
) -> tuple[list[Finding], CollectiveSignature | None]:
    """The findings on one rank's trace (severity against that rank's own step), and its collective signature
    for the cross-rank rules. `modules`: the rank's collectives and the modules they serve, to name the modules
    a finding's windows hold (`evidence.modules`)."""
    findings, signature = _diagnose(RankFacts(model, metrics, job))
    return _without_covers(findings, modules), signature


def diagnose_rank_located(
    model: TraceModel, metrics: RankMetrics, job: JobContext, modules: ModuleIndex | None = None
) -> tuple[list[Finding], CollectiveSignature | None, list[Blame]]:
    """`diagnose_rank`, plus the host events each finding blames (for the timelines: diagnose/locate.py)."""
    from overlapcheck.diagnose.locate import blamed_events

    facts = RankFacts(model, metrics, job)
    findings, signature = _diagnose(facts)
    return _without_covers(findings, modules), signature, blamed_events(facts, findings)


def _without_covers(findings: list[Finding], modules: ModuleIndex | None = None) -> list[Finding]:
    """The findings as they leave the rank: the windows they charge stay in the worker (facts/coverage.py). With
    `modules`, a finding whose windows hold exposed collectives of named modules names them, most exposed first
    (`evidence.modules`: docs/rules.md, How a finding is built)."""
    out = []
    for f in findings:
        named = []
        if modules is not None and isinstance(f.covers, iv.Intervals) and len(f.covers):
            named = modules.named_in(f.covers, f.cost_us)
        evidence = {**f.evidence, "modules": named} if named else f.evidence
        out.append(dataclasses.replace(f, covers=None, evidence=evidence))
    return out


def _diagnose(facts: RankFacts) -> tuple[list[Finding], CollectiveSignature | None]:
    found: list[Finding] = []
    for rule in RULES:
        if rule.find is None:
            continue
        # DeepSpeed always has the inherent syncs: report them only when they cost something
        found.extend(f for f in rule.find(facts) if not (rule.inherent and f.cost_us < INHERENT_MIN_US))
    found = _apply_claims(found)
    cov = coverage(facts, found, LIMITS)
    for rule in RULES:
        if rule.residual is not None:
            more = rule.residual(facts, cov)
            found += more
            if more and not rule.leftover:  # what it explains is no longer unexplained for the rules after it
                cov = coverage(facts, found, LIMITS)
    step_us = facts.step_time_us
    signature = collective_signature(facts)
    if signature is not None:
        signature = dataclasses.replace(
            signature,
            exposed_us=round(cov.exposed_us, 3),
            explained_us=round(cov.explained_us, 3),
            inherent_us=round(cov.inherent_us, 3),
            inherent_parts_us=per_collective(facts, cov.inherent),
            tail_us=per_collective(facts, cov.tails),
        )
    return [_with_severity(f, step_us) for f in found], signature


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


def merge_findings(facts: JobFacts) -> tuple[list[Finding], float | None]:
    """Merge per-rank findings across ranks, add cross-rank findings, rank them by cost.

    `facts.results` in rank order. Returns the findings and the share of exposed communication they explain."""
    results, job = facts.results, facts.job
    crossed = _claimed_among(
        [f for rule in RULES if rule.cross is not None for f in rule.cross(facts)], _step_us(results)
    )
    across = _cross_covers([f for f in crossed if not BY_ID[f.rule].from_inherent])
    groups: dict[tuple[str, tuple[object, ...]], list[Finding]] = {}
    for r in results:
        for f in r.findings:
            if BY_ID[f.rule].leftover:
                rest = _less_cross_explained(f, r, across)
                if rest is None:
                    continue
                f = rest
            groups.setdefault(BY_ID[f.rule].merge_key(f), []).append(f)
    merged = [
        m
        for m in (_merge(group) for group in groups.values())
        if not BY_ID[m[0].rule].inherent or m[0].cost_us >= INHERENT_MIN_US
    ]
    merged = _claimed_across(merged, crossed)
    merged.extend((dataclasses.replace(f, covers=None, paces=BY_ID[f.rule].paces or None), {}) for f in crossed)
    findings = _paced_by_straggler(merged)
    findings = [_drop_applied(f, job) for f in findings]
    ranks = [r.metrics for r in results]
    step_us = _mean([r.step_time_us / max(1, len(r.steps)) for r in ranks if r.step_time_us])
    findings = [_with_severity(f, step_us) for f in findings]
    findings.sort(key=lambda f: (BY_ID[f.rule].limit, -f.cost_us, f.rule))
    return findings, _explained(results, _cross_covers(crossed))


def _step_us(results: Sequence[RankResult]) -> float:
    ranks = [r.metrics for r in results]
    return _mean([r.step_time_us / max(1, len(r.steps)) for r in ranks if r.step_time_us])


def _claimed_among(crossed: list[Finding], step_us: float) -> list[Finding]:
    """Cross-rank findings less what another cross-rank finding explains on the same ranks (`explains`: a
    straggler explains the others' waiting for peers), rank by rank; one left under its rule's `min_share` of
    the step is dropped."""
    out = []
    for f in crossed:
        covers = {int(r): float(us) for r, us in f.covers.items()} if isinstance(f.covers, dict) else {}
        claimants = [c for c in crossed if f.rule in BY_ID[c.rule].explains and isinstance(c.covers, dict)]
        for claimant in claimants:
            for rank, us in claimant.covers.items():
                if int(rank) in covers:
                    covers[int(rank)] = max(0.0, covers[int(rank)] - float(us))
        if not claimants or not covers:
            out.append(f)
            continue
        left = [us for us in covers.values() if us > 0]
        cost = round(statistics.fmean(left), 3) if left else 0.0
        if cost <= 0 or cost < BY_ID[f.rule].min_share * step_us:
            continue
        evidence = {**f.evidence, "explained_by": claimants[0].rule}
        out.append(dataclasses.replace(f, cost_us=cost, covers=covers, evidence=evidence))
    return out


def accounting_notes(results: Sequence[RankResult]) -> list[str]:
    """What the accounting could not decide, as notes: ranks no rule applies to (`inapplicable`), and with only
    some ranks of the world here, the first gathers' and last buckets' time that is transfer or waiting for peers
    these traces cannot tell apart (`readings`)."""
    return [*inapplicable([r.metrics for r in results]), *readings(results)]


def readings(results: Sequence[RankResult]) -> list[str]:
    """With some ranks of the world missing, a collective's shortest kernel here may still include waiting for an
    absent peer: the time of each step's first all-gather and last bucket reads two ways, both given."""
    worlds = [r.metrics.world_size for r in results if r.metrics.world_size]
    present = {r.metrics.rank for r in results}
    sigs = [r.signature for r in results if r.signature is not None and r.signature.tail_us]
    if not worlds or not sigs or len(present) >= max(w for w in worlds if w is not None):
        return []
    world = max(w for w in worlds if w is not None)
    tail = statistics.median(sum(s.tail_us) / max(1, s.steps) for s in sigs) / 1000
    best = statistics.median(sum(s.inherent_parts_us) / max(1, s.steps) for s in sigs) / 1000
    if tail - best < 0.01:
        return []  # both readings agree
    who = f"one rank of {world}" if len(present) == 1 else f"{len(present)} ranks of {world}"
    return [
        f"{who}: a collective's duration includes waiting for peers that are not in these traces, which they cannot "
        f"tell from a slow link. Of each step's first all-gather and last gradient bucket ({tail:.2f} ms/step, "
        f"median rank): read as a slow link, all of it is transfer and inherent; read as waiting for peers, only "
        f"{best:.2f} ms/step is (the fastest kernel of the same size here), and {tail - best:.2f} ms/step is "
        "counted unexplained. Analyze every rank's trace to tell them apart"
    ]


def inapplicable(ranks: Sequence[RankMetrics]) -> list[str]:
    """Which rules could not apply to these ranks and why, as a note: most rules read what only a GPU trace has
    (`Rule.needs` GPU_FACTS), so on a rank measured on CPU lanes (a gloo run) only the others can find anything."""
    cpu = [r for r in ranks if r.lanes == "cpu" and r.collectives["all"].count]
    if not cpu:
        return []
    exposed = statistics.median(r.exposed_per_step() for r in cpu) / 1000
    gpu_only = [rule.id for rule in RULES if rule.needs == GPU_FACTS]
    others = [rule.id for rule in RULES if rule.needs != GPU_FACTS]
    which = f"{len(gpu_only)} of the {len(RULES)} rules" + (f" (all but {', '.join(others)})" if others else "")
    return [
        f"{len(cpu)} rank(s) were measured on CPU (gloo) lanes: {which} read {GPU_FACTS}, which a CPU-only trace "
        f"does not have, so they cannot apply; of the {exposed:.2f} ms/step (median rank) of exposed gloo "
        "communication, what the findings do not explain is not diagnosed (the per-collective table says which "
        "collectives and phases it is in)"
    ]


def _cross_covers(crossed: list[Finding]) -> dict[int, float]:
    """Per rank: the exposed communication per step the cross-rank findings explain there (their `covers`: rank
    -> µs per step, e.g. the time a rank waits inside collectives for a straggler)."""
    out: dict[int, float] = {}
    for f in crossed:
        if isinstance(f.covers, dict):
            for rank, us in f.covers.items():
                out[int(rank)] = out.get(int(rank), 0.0) + float(us)
    return out


def _less_cross_explained(f: Finding, result: RankResult, across: dict[int, float]) -> Finding | None:
    """A rank's unexplained exposure, less what the cross-rank findings explain on that rank; None when too
    little is left to report."""
    rank = result.metrics.rank
    explained = across.get(rank, 0.0) if rank is not None else 0.0
    if not explained:
        return f
    cost = round(max(0.0, f.cost_us - explained), 3)
    steps = result.metrics.steps
    step_us = (result.metrics.step_time_us or 0.0) / max(1, len(steps))
    if cost <= 0 or cost < BY_ID[f.rule].min_share * step_us:
        return None
    evidence = {**f.evidence, "unexplained_us_per_step": cost, "explained_across_ranks_us_per_step": explained}
    return dataclasses.replace(f, cost_us=cost, evidence=evidence)


def _claimed_across(merged: list[tuple[Finding, RankCosts]], crossed: list[Finding]) -> list[tuple[Finding, RankCosts]]:
    """Subtract from the merged findings of the rules a cross-rank finding explains what it explains on each rank
    (its `covers`: rank -> µs per step; the costliest claimed finding of a rank first), so that one exposed
    microsecond is charged once: the other ranks' waits for a straggler are the straggler's, not stream waits."""
    for claimant in crossed:
        explains = BY_ID[claimant.rule].explains
        covers = claimant.covers if isinstance(claimant.covers, dict) else {}
        claimed = sorted(
            (i for i, (f, _) in enumerate(merged) if f.rule in explains), key=lambda i: -merged[i][0].cost_us
        )
        if not claimed or not covers:
            continue
        budget = {int(r): float(us) for r, us in covers.items()}
        for i in claimed:
            f, costs = merged[i]
            left = {}
            for rank, cost in costs.items():
                take = min(cost, budget.get(rank, 0.0))
                budget[rank] = budget.get(rank, 0.0) - take
                left[rank] = cost - take
            if left == costs:
                continue
            cost = round(_mean(list(left.values())), 3)
            evidence = {**f.evidence, "explained_by": claimant.rule}
            merged[i] = (dataclasses.replace(f, cost_us=cost, evidence=evidence), left)
    return merged


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
    slow = next((f.ranks[0] for f, _ in findings if BY_ID[f.rule].paces and f.ranks), None)
    out = []
    for f, costs in findings:
        if slow is not None and slow in costs and len(costs) > 1:
            f = dataclasses.replace(f, cost_us=round(costs[slow], 3), evidence={**f.evidence, "cost_from_rank": slow})
        out.append(f)
    return out


def _explained(results: Sequence[RankResult], across: dict[int, float]) -> float | None:
    """Share of the exposed communication (summed over ranks) that the findings cover: per rank, the union of its
    own findings' windows (facts/coverage.py), plus what the cross-rank findings explain there, counted only on
    the part the rank's own findings left uncovered. Old summaries without coverage count their findings'
    costs, at most the rank's exposed time."""
    exposed = explained = 0.0
    for r in results:
        if not r.metrics.collectives["all"].count:
            continue
        sig = r.signature
        rank_exposed = (
            sig.exposed_us if sig is not None and sig.exposed_us is not None else r.metrics.exposed_per_step()
        )
        if sig is not None and sig.explained_us is not None:
            own = sig.explained_us
        else:
            own = sum(f.cost_us for f in r.findings)
        own = min(own, rank_exposed)
        cross = across.get(r.metrics.rank, 0.0) if r.metrics.rank is not None else 0.0
        exposed += rank_exposed
        explained += own + min(rank_exposed - own, cross)
    if not exposed:
        return None
    return round(min(1.0, explained / exposed), 4)


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


# ds_config keys (a dotted prefix) that DeepSpeed reads only from a version on (docs/rules.md, Fixes by version)
CONFIG_SINCE = {"timers.throughput": "0.14.3"}  # ThroughputTimer config, DeepSpeed #5363


def _drop_applied(f: Finding, job: JobContext) -> Finding:
    """Remove from a fix what the job already has: an upgrade to a DeepSpeed it runs, an environment variable to
    unset that its environment does not set (when the job context records them). And keep out of it the config
    keys the job's DeepSpeed does not have (CONFIG_SINCE): known older than the key, or older than an upgrade the
    fix already asks for; the fix becomes that upgrade, and the reason says what to set once upgraded."""
    fix = f.fix
    upgrade = fix.upgrade
    wanted = upgrade.split(">=", 1)[1] if isinstance(upgrade, str) and upgrade.startswith("deepspeed>=") else None
    config, why = fix.config, f.why
    missing = {
        key: since
        for key in fix.config or {}
        for prefix, since in CONFIG_SINCE.items()
        if key == prefix or key.startswith(prefix + ".")
        if (_version(job.deepspeed_version) < _version(since) if job.deepspeed_version else False)
        or (not job.deepspeed_version and wanted is not None and _version(wanted) >= _version(since))
    }
    if missing and fix.config is not None:
        config = {k: v for k, v in fix.config.items() if k not in missing} or None
        newest = max(missing.values(), key=_version)
        if wanted is None or _version(wanted) < _version(newest):
            upgrade, wanted = f"deepspeed>={newest}", newest
        keys = ", ".join(f"{k}: {_json(fix.config[k])}" for k in missing)
        why = f"{f.why}; the key exists from DeepSpeed {newest}: upgrade, then set {keys}"
    if wanted and job.deepspeed_version and _version(job.deepspeed_version) >= _version(wanted):
        upgrade = None
    env = fix.env
    if env is not None and job.env is not None:
        env = {k: v for k, v in env.items() if v is not None or k in job.env} or None
    if upgrade == fix.upgrade and env == fix.env and config == fix.config:
        return f
    return dataclasses.replace(f, why=why, fix=Fix(config=config, env=env, upgrade=upgrade))


def _json(value: object) -> str:
    """A config value as the ds_config JSON writes it (false, 5e7 as an integer)."""
    return "true" if value is True else "false" if value is False else "null" if value is None else str(value)


def _version(text: str) -> tuple[int, ...]:
    """'0.13.3' -> (0, 13, 3); stops at the first part that is not a number ('2.1.0+cu121' -> (2, 1, 0))."""
    out = []
    for part in text.split("+")[0].split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)
