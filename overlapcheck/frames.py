"""The Report as pandas DataFrames, one level at a time (`Report.dataframe(level)`; columns: docs/api.md).

pandas is imported here, on first use, so that the CLI never pays for it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from overlapcheck.errors import UserError
from overlapcheck.model import ALL, COLLECTIVE_KEYS, Collectives, Report, Split

if TYPE_CHECKING:
    import pandas as pd

LEVELS = ("ranks", "collectives", "steps", "phases", "modules", "findings")


def dataframe(report: Report, level: str) -> pd.DataFrame:
    """One row per rank, per (rank, collective), per (rank, step), per (rank, step, phase, collective), per
    (module, collective, phase, source) over the ranks, or per finding."""
    if not isinstance(level, str) or level not in _BUILDERS:
        raise UserError(f"dataframe: unknown level {str(level)[:40]!r}: one of {', '.join(LEVELS)}")
    import pandas as pd

    rows, columns = _BUILDERS[level](report)
    return pd.DataFrame(rows, columns=columns)


def _split(split: Split, prefix: str = "") -> dict[str, Any]:
    return {
        f"{prefix}count": split.count,
        f"{prefix}time_us": split.time_us,
        f"{prefix}overlapped_us": split.overlapped_us,
        f"{prefix}exposed_us": split.exposed_us,
        f"{prefix}overlap": split.overlap,
    }


def _kinds(collectives: Collectives) -> list[str]:
    """`all` and the kinds that have communication."""
    return [k for k in COLLECTIVE_KEYS if k == ALL or collectives[k].count]


Rows = tuple[list[dict[str, Any]], list[str]]

_RANK_FIELDS = ["rank", "host", "world_size", "backend", "lanes", "span_us", "busy_us", "compute_us", "idle_us"]
_RANK_FIELDS += ["step_time_us", "exposed_share"]
_RANK = [*_RANK_FIELDS, "steps", "comm_count", "comm_time_us", "comm_overlapped_us", "comm_exposed_us", "overlap"]
_RANK += ["source"]


def _ranks(report: Report) -> Rows:
    rows = []
    for r in report.ranks:
        row = {k: getattr(r, k) for k in _RANK_FIELDS}
        row["steps"] = len(r.steps)
        row.update(_split(r.collectives[ALL], "comm_"))
        row["overlap"] = row.pop("comm_overlap")
        row["source"] = r.source
        rows.append(row)
    return rows, _RANK


_SPLIT = ["count", "time_us", "overlapped_us", "exposed_us", "overlap"]


def _collectives(report: Report) -> Rows:
    rows = [
        {"rank": r.rank, "collective": k, **_split(r.collectives[k])}
        for r in report.ranks
        for k in _kinds(r.collectives)
    ]
    return rows, ["rank", "collective", *_SPLIT]


_STEP = ["rank", "step", "start_us", "duration_us", "cpu_duration_us", "compute_us", "exposed_share"]
_STEP += ["comm_count", "comm_time_us", "comm_overlapped_us", "comm_exposed_us", "overlap"]
_STEP += ["period_start_us", "period_us"]


def _steps(report: Report) -> Rows:
    rows = []
    for r in report.ranks:
        for s in r.steps:
            row = {k: getattr(s, k) for k in _STEP[1:7]}
            row.update(_split(s.collectives[ALL], "comm_"))
            row["overlap"] = row.pop("comm_overlap")
            row.update(period_start_us=s.period_start_us, period_us=s.period_us)
            rows.append({"rank": r.rank, **row})
    return rows, _STEP


def _phases(report: Report) -> Rows:
    rows = []
    for r in report.ranks:
        for s in r.steps:
            for phase, p in s.phases.items():
                for k in _kinds(p.collectives):
                    rows.append(
                        {"rank": r.rank, "step": s.step, "phase": phase, "compute_us": p.compute_us, "collective": k}
                        | _split(p.collectives[k])
                    )
    return rows, ["rank", "step", "phase", "compute_us", "collective", *_SPLIT]


_MODULE = ["module", "class", "collective", "phase", "source", "count", "time_us", "exposed_us", "hidden_us"]
_MODULE += ["exposed_us_per_rank_step"]


def _modules(report: Report) -> Rows:
    """The MODULES rows (summed over the ranks), and the exposed µs per rank and profiled step."""
    m = report.modules
    if m is None:
        return [], _MODULE
    per = m.rank_steps or m.ranks or 1
    rows = [
        {
            "module": r.module,
            "class": r.cls,
            "collective": r.kind,
            "phase": r.phase,
            "source": r.source,
            "count": r.count,
            "time_us": r.time_us,
            "exposed_us": r.exposed_us,
            "hidden_us": r.hidden_us,
            "exposed_us_per_rank_step": r.exposed_us / per,
        }
        for r in m.rows
    ]
    return rows, _MODULE


_FINDING = ["rule", "severity", "title", "cost_us", "ranks", "steps", "why", "fix_config", "fix_env", "fix_upgrade"]


def _findings(report: Report) -> Rows:
    rows = []
    for f in report.findings:
        rows.append(
            {
                "rule": f.rule,
                "severity": f.severity,
                "title": f.title,
                "cost_us": f.cost_us,
                "ranks": list(f.ranks),
                "steps": list(f.steps),
                "why": f.why,
                "fix_config": dict(f.fix.config) if f.fix.config else None,
                "fix_env": dict(f.fix.env) if f.fix.env else None,
                "fix_upgrade": f.fix.upgrade,
            }
        )
    return rows, _FINDING


_BUILDERS: dict[str, Callable[[Report], Rows]] = {
    "ranks": _ranks,
    "collectives": _collectives,
    "steps": _steps,
    "phases": _phases,
    "modules": _modules,
    "findings": _findings,
}
