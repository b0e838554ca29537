"""Check that a code change leaves every JSON report unchanged: the reports of REF and of the working tree.

    .venv/bin/python -m benchmarks.report_identity                 # against HEAD
    .venv/bin/python -m benchmarks.report_identity --ref v0.1.0    # against any git ref
    .venv/bin/python -m benchmarks.report_identity --save DIR      # only write the working tree's reports

Inputs: every set in `sample_traces/` (a folder each), every set of `../shared/traces` (a folder each, the
edge cases a file each), and the per-rank summaries written for one sample set. Both versions run the CLI
(`python -m overlapcheck analyze ... --format json`) from the repository root with the same relative paths,
so the reports must be byte-identical. Exit 0 when they are, 1 with the first differences otherwise.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"


def inputs() -> dict[str, list[str]]:
    """name -> the paths (relative to the repository root when possible) of one `analyze` call."""
    out: dict[str, list[str]] = {}
    for folder in sorted((ROOT / "sample_traces").iterdir()):
        if folder.is_dir():
            out[f"sample/{folder.name}"] = [os.path.relpath(folder, ROOT)]
    if SHARED.is_dir():
        for folder in sorted(SHARED.iterdir()):
            if not folder.is_dir():
                continue
            if folder.name == "edge-cases":
                for f in sorted(folder.iterdir()):
                    out[f"shared/edge-cases/{f.name}"] = [os.path.relpath(f, ROOT)]
            else:
                out[f"shared/{folder.name}"] = [os.path.relpath(folder, ROOT)]
    return out


SUMMARIZED = ("straggler", "reduce-throttle")  # sample sets also analyzed through per-rank summaries


def _summaries(code: Path, env: dict[str, str], dest: Path) -> dict[str, list[str]]:
    """Write the per-rank summaries of the SUMMARIZED sets with `code` (as `overlapcheck run` would) into
    folders under `dest`, with the set's ds_config beside them; name -> the folder to analyze."""
    out = {}
    for name in SUMMARIZED:
        src = ROOT / "sample_traces" / name
        folder = dest / f"summaries-{name}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "ds_config.json").write_bytes((src / "ds_config.json").read_bytes())
        for trace in sorted(src.glob("rank*.trace.json.gz")):
            rank = trace.name.split(".")[0]
            args = ["--trace", str(trace), "--out", str(folder / f"{rank}.summary.json")]
            args += ["--status", str(dest / f"{name}-{rank}.status.json")]
            subprocess.run([*_python_m(code, "overlapcheck.capture.summary"), *args], env=env, check=True)
        out[f"summaries/{name}"] = [str(folder)]
    return out


def _python_m(code: Path, module: str) -> list[str]:
    """`python -m MODULE` importing overlapcheck from `code`: `-m` puts the current folder (the repository root,
    the working tree) before PYTHONPATH on sys.path, so PYTHONPATH alone would run the working tree's code twice."""
    boot = (
        "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
        "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-c", boot, str(code), module]


def write_reports(code: Path, dest: Path) -> dict[str, int]:
    """Run `analyze --format json` of the code at `code` on every input; returns each input's exit code."""
    dest.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(code), "NO_COLOR": "1"}
    codes = {}
    for name, paths in {**inputs(), **_summaries(code, env, dest / "work")}.items():
        target = dest / (name.replace("/", "__") + ".json")
        cmd = [*_python_m(code, "overlapcheck"), "analyze", *paths, "--format", "json", "-o", str(target)]
        proc = subprocess.run([*cmd, "--force"], cwd=ROOT, env=env, capture_output=True, text=True)
        codes[name] = proc.returncode
        if not target.exists():
            target.write_text(json.dumps({"exit": proc.returncode, "stderr": proc.stderr[-2000:]}) + "\n")
    return codes


def compare(a: Path, b: Path) -> list[str]:
    """Names of the reports that differ, with a short diff of each."""
    problems = []
    for left in sorted(a.glob("*.json")):
        right = b / left.name
        if not right.exists():
            problems.append(f"{left.name}: missing in the new reports")
            continue
        x, y = left.read_text().splitlines(), right.read_text().splitlines()
        if x != y:
            diff = list(difflib.unified_diff(x, y, "before", "after", lineterm="", n=1))[:40]
            problems.append(f"{left.name}:\n  " + "\n  ".join(diff))
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", default="HEAD", help="git ref to compare with (default HEAD)")
    parser.add_argument("--save", metavar="DIR", help="only write the working tree's reports to DIR")
    args = parser.parse_args()
    if args.save:
        write_reports(ROOT, Path(args.save))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(old), args.ref], cwd=ROOT, check=True)
        try:
            codes_old = write_reports(old, Path(tmp) / "before")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(old)], cwd=ROOT, check=False)
        codes_new = write_reports(ROOT, Path(tmp) / "after")
        problems = compare(Path(tmp) / "before", Path(tmp) / "after")
        problems += [
            f"{n}: exit {codes_old[n]} -> {codes_new.get(n)}" for n in codes_old if codes_old[n] != codes_new.get(n)
        ]
    print(f"{len(codes_old)} reports compared with {args.ref}: {len(problems)} differ")
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
