"""Generate every scenario, run the current tree's `overlapcheck analyze DIR --format json` on it, and score.

    python -m benchmarks.scenarios.score --out DIR [--only NAME ...] [--keep]

Prints one table (scenario, expected, top finding with cost and severity, fix key right?, false alarms, verdict)
and "right on K of N"; writes DIR/results.json. Deterministic: every scenario is seeded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.scenarios.gen import write
from benchmarks.scenarios.scenarios import ANY, Scenario, scenarios

RUN_JSON = {
    "schema": "overlapcheck.run/1",
    "status": "finished",
    "command": "deepspeed --hostfile hostfile train.py --deepspeed ds_config.json",
    "launcher": "deepspeed",
    "profiler": {
        "wait": 1,
        "warmup": 1,
        "active": 3,
        "first_step": 2,
        "last_step": 4,
        "with_stack": True,
        "record_shapes": False,
    },
    "versions": {"python": "3.11.9", "torch": "2.9.1", "deepspeed": "0.19.8", "cuda": "12.8", "nccl": "2.27.5"},
    "backend": "nccl",
    "gpus": ["NVIDIA H100 80GB HBM3"],
    "missing_ranks": [],
    "incomplete_ranks": [],
    "notes": [],
}
SEVERE = ("warning", "critical")


def fix_keys(finding: dict[str, Any]) -> list[str]:
    fix = finding.get("fix") or {}
    return [*(fix.get("config") or {}), *(fix.get("env") or {})]


def judge(sc: Scenario, report: dict[str, Any]) -> dict[str, Any]:
    findings = report.get("findings") or []
    causes = [f for f in findings if f.get("rule")]
    top = causes[0] if causes else None
    severe = [f for f in causes if f.get("severity") in SEVERE]
    allowed = set(sc.expect) | set(sc.also_ok)
    false_alarms = [f["rule"] for f in severe if f["rule"] not in allowed or f["rule"] in sc.forbid]
    if sc.expect:
        top_severe = severe[0] if severe else None
        top_ok = top_severe is not None and top_severe["rule"] in sc.expect
        judged = top_severe
    else:
        top_ok = not severe
        judged = severe[0] if severe else top
    if sc.fix == ANY or not sc.expect:
        fix_ok: bool | None = None
    elif sc.fix is None:
        fix_ok = judged is not None and not fix_keys(judged)
    else:
        fix_ok = judged is not None and any(k == sc.fix or k.startswith(sc.fix + ".") for k in fix_keys(judged))
    named = {f["rule"] for f in severe}
    missing = ["|".join(g) for g in sc.need if not named & set(g)]
    passed = top_ok and fix_ok is not False and not false_alarms and not missing
    return {
        "scenario": sc.name,
        "kind": sc.kind,
        "plants": sc.plants,
        "expected": list(sc.expect) or ["(nothing above info)"],
        "expected_fix": sc.fix,
        "top": None
        if judged is None
        else {
            "rule": judged["rule"],
            "cost_ms": round(judged.get("cost_us", 0.0) / 1e3, 3),
            "severity": judged.get("severity"),
            "fix_keys": fix_keys(judged),
        },
        "findings": [(f["rule"], f.get("severity"), round(f.get("cost_us", 0.0) / 1e3, 3)) for f in causes],
        "top_ok": top_ok,
        "fix_ok": fix_ok,
        "false_alarms": false_alarms,
        "missing": missing,
        "pass": passed,
        "step_ms": _step_ms(report),
    }


def _step_ms(report: dict[str, Any]) -> float | None:
    ranks = report.get("ranks") or []
    vals = sorted(r["step_time_us"] / max(1, len(r.get("steps") or [1])) for r in ranks if r.get("step_time_us"))
    return round(vals[len(vals) // 2] / 1e3, 2) if vals else None


def run_one(sc: Scenario, out: Path) -> dict[str, Any]:
    d = out / sc.name
    if d.exists():
        shutil.rmtree(d)
    run_json = None
    if sc.run_json:
        run_json = dict(RUN_JSON, env=dict(sc.env))
    write(sc.cfg, d, sc.ds, run_json)
    rep = out / f"{sc.name}.report.json"
    if rep.exists():
        rep.unlink()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run(
        [sys.executable, "-m", "overlapcheck", "analyze", str(d), "--format", "json", "-o", str(rep)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if not rep.exists():
        return {
            "scenario": sc.name,
            "kind": sc.kind,
            "pass": False,
            "error": (proc.stderr or proc.stdout)[-600:],
            "expected": list(sc.expect),
            "top_ok": False,
            "fix_ok": None,
            "false_alarms": [],
            "top": None,
        }
    return judge(sc, json.loads(rep.read_text()))


def table(results: list[dict[str, Any]]) -> str:
    rows = [("scenario", "expected", "top finding (rule, ms/step, severity)", "fix", "false alarms", "verdict")]
    for r in results:
        t = r.get("top")
        top = "-" if t is None else f"{t['rule']} {t['cost_ms']:.2f} {t['severity']}"
        if r.get("error"):
            top = "ERROR " + r["error"].splitlines()[-1][:60]
        fix = {True: "yes", False: "NO", None: "-"}[r.get("fix_ok")]
        rows.append(
            (
                r["scenario"],
                ",".join(r["expected"]),
                top,
                fix,
                ",".join([*r["false_alarms"], *("missing:" + m for m in r.get("missing") or [])]) or "-",
                "pass" if r["pass"] else "FAIL",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    k = sum(r["pass"] for r in results)
    lines.append(f"\nright on {k} of {len(results)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--keep", action="store_true", help="keep the generated traces (default: only the reports)")
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    results = []
    for sc in scenarios():
        if a.only and sc.name not in a.only:
            continue
        res = run_one(sc, a.out)
        results.append(res)
        print(f"{sc.name}: {'pass' if res['pass'] else 'FAIL'} {res.get('top')}", file=sys.stderr, flush=True)
        if not a.keep:
            shutil.rmtree(a.out / sc.name, ignore_errors=True)
    print(table(results))
    (a.out / "results.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
