"""Diagnosis: turn the measured trace into findings (what blocks the overlap, its cost, the fix).

`rank_findings` runs in the worker that holds one rank's TraceModel; `merge_findings` runs once over the report
document, merges the same finding across ranks, adds cross-rank findings and ranks them by cost. Rules:
docs/rules.md; one module per family (syncs, waits, buckets, streams, stragglers), listed in `registry`.
"""

from __future__ import annotations

import statistics
from typing import Any

from overlapcheck.trace.model import TraceModel


def rank_findings(model: TraceModel, rank: dict[str, Any], config: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Findings on one rank's trace (runs in the worker that holds the model). Entries whose rule starts with
    `_` carry compact per-rank data for the cross-rank rules and are not findings."""
    from overlapcheck.diagnose import registry
    from overlapcheck.diagnose.context import RankView

    registry.load()
    view = RankView(model, rank, config)
    out: list[dict[str, Any]] = []
    for rule in registry.RANK_RULES:
        out.extend(rule(view))
    _apply_claims(out, registry.CLAIMS)
    return out


def _apply_claims(findings: list[dict[str, Any]], claims: dict[str, tuple[str, ...]]) -> None:
    """Subtract from a finding's cost what a more specific finding on the same rank already explains."""
    for claimant in findings:
        for claimed in findings:
            if claimed["rule"] in claims.get(claimant["rule"], ()):
                claimed["cost_us"] = round(max(0.0, claimed["cost_us"] - claimant["cost_us"]), 3)


def merge_findings(report: dict[str, Any], config: dict[str, Any] | None) -> tuple[list[dict[str, Any]], float | None]:
    """Merge per-rank findings across ranks, add cross-rank findings, rank them by cost.

    Returns the findings and the share of exposed communication they explain.
    """
    from overlapcheck.diagnose import registry
    from overlapcheck.diagnose.finding import severity_of

    registry.load()
    ranks = report.get("ranks") or []
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in ranks:
        for f in r.get("_findings") or []:
            if not str(f.get("rule", "")).startswith("_"):
                groups.setdefault((f["rule"], f.get("_key", "")), []).append(f)
    merged = [
        f
        for f in (_merge(group) for group in groups.values())
        if f["rule"] not in registry.INHERENT or f["cost_us"] >= registry.INHERENT_MIN_US
    ]
    for rule in registry.CROSS_RULES:
        merged.extend(rule(report, config))
    _paced_by_straggler(merged)
    _drop_applied(merged, config, report.get("run"))
    step_us = _mean([r["step_time_us"] / max(1, len(r.get("steps") or [])) for r in ranks if r.get("step_time_us")])
    for f in merged:
        f.pop("_key", None)
        f.pop("_rank_costs", None)
        if f.get("severity") is None or f["rule"] in registry.SEVERITY_CAP or f["rule"] in registry.SEVERITY_SHARES:
            shares = registry.SEVERITY_SHARES.get(f["rule"])
            f["severity"] = severity_of(
                f["cost_us"], step_us, registry.SEVERITY_CAP.get(f["rule"]), *([shares] if shares else [])
            )
    merged.sort(key=lambda f: (-f["cost_us"], f["rule"]))
    return merged, _explained(ranks, merged)


def _merge(group: list[dict[str, Any]]) -> dict[str, Any]:
    """One finding from the same rule on several ranks: mean cost over the ranks that show it, the evidence of
    the rank where it costs most, and the spread of costs across ranks."""
    worst = max(group, key=lambda f: f["cost_us"])
    out = dict(worst)
    costs = {r: f["cost_us"] for f in group for r in f["ranks"]}
    out["cost_us"] = round(_mean(list(costs.values())), 3)
    out["_rank_costs"] = costs
    out["ranks"] = sorted(costs)
    out["steps"] = sorted({s for f in group for s in f["steps"]})
    evidence = dict(worst["evidence"])
    if len(costs) > 1:
        values = sorted(costs.values())
        evidence["cost_us_across_ranks"] = {
            "min": values[0],
            "median": statistics.median(values),
            "max": values[-1],
            "worst_rank": max(costs, key=costs.get),
        }
    out["evidence"] = evidence
    return out


def _paced_by_straggler(findings: list[dict[str, Any]]) -> None:
    """With a straggler, every collective waits for it, so the step runs at the straggler's pace: a per-rank
    cause costs the job what it costs on the straggler's rank. Elsewhere its measured cost includes the time
    that rank waits inside collectives for the straggler, which the straggler finding already counts."""
    slow = next((f["ranks"][0] for f in findings if f["rule"] == "straggler" and f["ranks"]), None)
    if slow is None:
        return
    for f in findings:
        costs = f.get("_rank_costs") or {}
        if slow in costs and len(costs) > 1:
            f["cost_us"] = round(costs[slow], 3)
            f["evidence"] = {**f["evidence"], "cost_from_rank": slow}


def _explained(ranks: list[dict[str, Any]], findings: list[dict[str, Any]]) -> float | None:
    """Share of the exposed communication per step (mean over ranks) that the findings' costs account for."""
    exposed = _mean(
        [
            sum(s["collectives"]["all"]["exposed_us"] for s in r["steps"]) / len(r["steps"])
            if r.get("steps")
            else r["collectives"]["all"]["exposed_us"]
            for r in ranks
            if r["collectives"]["all"]["count"]
        ]
    )
    if not exposed:
        return None
    explained = sum(f["cost_us"] for f in findings if f.get("explains_exposed", True))
    return round(min(1.0, explained / exposed), 4)


def _mean(values: list[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def _drop_applied(findings: list[dict[str, Any]], config: dict[str, Any] | None, run: dict[str, Any] | None) -> None:
    """Remove from fixes what the job already has: an upgrade to a DeepSpeed it runs, an environment variable
    its environment does not set (when the run manifest or the config's `_overlapcheck_job` lists them)."""
    job = (config or {}).get("_overlapcheck_job") if isinstance(config, dict) else None
    job = job if isinstance(job, dict) else {}
    run = run if isinstance(run, dict) else {}
    versions = run.get("versions") if isinstance(run.get("versions"), dict) else {}
    installed = versions.get("deepspeed") or job.get("deepspeed")
    env = run.get("env") if isinstance(run.get("env"), dict) else job.get("env")
    for f in findings:
        fix = f.get("fix") or {}
        upgrade = fix.get("upgrade")
        wanted = upgrade.split(">=", 1)[1] if isinstance(upgrade, str) and upgrade.startswith("deepspeed>=") else None
        if wanted and isinstance(installed, str) and _version(installed) >= _version(wanted):
            fix.pop("upgrade")
        if isinstance(fix.get("env"), dict) and isinstance(env, dict):
            kept = {k: v for k, v in fix["env"].items() if v is not None or k in env}
            if kept:
                fix["env"] = kept
            else:
                fix.pop("env")


def _version(text: str) -> tuple[int, ...]:
    """'0.13.3' -> (0, 13, 3); stops at the first part that is not a number ('2.1.0+cu121' -> (2, 1, 0))."""
    out = []
    for part in text.split("+")[0].split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)
