"""Benchmark `overlapcheck analyze` against HTA and plain JSON parsers on the same large traces.

    .venv/bin/python -m benchmarks.bench_analyze            # 50 MB, 500 MB sim + 500 MB real; add --big for 2 GB
    .venv/bin/python -m benchmarks.bench_analyze --quick    # 50 MB sim + 100 MB real, a couple of minutes

Every measurement is a separate process (start-up and imports included): wall time, CPU time and peak RSS.
Results are printed as a table with ratios and saved to benchmarks/data/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from benchmarks import inputs as I
from benchmarks.measure import Run, best, measure

PY = sys.executable
MB = 1 << 20

_JSON_LOAD = "import json, sys\nwith open(sys.argv[1], 'rb') as f: json.load(f)"
_ORJSON = "import orjson, sys\nwith open(sys.argv[1], 'rb') as f: orjson.loads(f.read())"
_GUNZIP = """import sys
{imp}
with {opener}(sys.argv[1], 'rb') as f:
    while f.read(16 << 20): pass"""
_HTA = """import sys
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap(visualize=False)"""


def _analyze(paths: list[str], out: str, jobs: int | None = None, proposed: bool = False) -> list[str]:
    """`overlapcheck analyze`, or with `proposed` the same with the changes awaiting review (benchmarks/proposed.py)."""
    module = "benchmarks.proposed" if proposed else "overlapcheck"
    argv = [PY, "-m", module, "analyze", *paths, "--format", "json", "-o", out, "--force"]
    return argv + (["--jobs", str(jobs)] if jobs else [])


def _hta_folder(path: str, tmp: str) -> str:
    """HTA reads a folder of rank files: one symlink named like a rank file."""
    folder = tempfile.mkdtemp(dir=tmp)
    os.symlink(os.path.abspath(path), os.path.join(folder, "rank-0.json" + (".gz" if path.endswith(".gz") else "")))
    return folder


def bench_input(
    inp: I.Input, repeat: int, baseline_max_mb: int, tmp: str, hta_timeout: float, only: set[str] | None = None
) -> dict[str, Run]:
    out = os.path.join(tmp, "report.json")
    runs: dict[str, list[str]] = {
        "analyze": _analyze([inp.path], out),
        "analyze (proposed)": _analyze([inp.path], out, proposed=True),
    }
    if inp.size <= baseline_max_mb * MB:  # these hold the whole document: 6-8x the file in memory
        runs["json.load"] = [PY, "-c", _JSON_LOAD, inp.path]
        runs["orjson.loads"] = [PY, "-c", _ORJSON, inp.path]
        runs["HTA"] = [PY, "-c", _HTA, _hta_folder(inp.path, tmp)]
    if inp.gz:
        runs["analyze .gz"] = _analyze([inp.gz], out)
        runs["analyze (proposed) .gz"] = _analyze([inp.gz], out, proposed=True)
        runs["gunzip (zlib)"] = [PY, "-c", _GUNZIP.format(imp="import gzip", opener="gzip.open"), inp.gz]
        runs["gunzip (isal)"] = [PY, "-c", _GUNZIP.format(imp="from isal import igzip", opener="igzip.open"), inp.gz]
    results = {}
    for name, argv in runs.items():
        if only and name not in only:
            continue
        limit = hta_timeout if name == "HTA" else 3600
        results[name] = best([measure(name, argv, timeout=limit) for _ in range(repeat)])
        _print_run(results[name], inp.size)
    return results


def bench_ranks(folder: str, repeat: int, tmp: str) -> dict[str, Run]:
    """The multi-rank set with 1 and with all cores: how the speed scales with cores."""
    out = os.path.join(tmp, "report.json")
    results = {}
    for jobs in sorted({1, os.cpu_count() or 1}):
        name = f"analyze {len(_traces(folder))} ranks -j{jobs}"
        results[name] = best([measure(name, _analyze([folder], out, jobs)) for _ in range(repeat)])
        _print_run(results[name], sum(os.path.getsize(p) for p in _traces(folder)))
    one, many = list(results.values())[0], list(results.values())[-1]
    if one.ok and many.ok and one is not many:
        print(f"    speed-up with {os.cpu_count()} cores: {one.wall_s / many.wall_s:.2f}x wall")
    return results


def _traces(folder: str) -> list[str]:
    return [os.path.join(folder, n) for n in os.listdir(folder) if n.startswith("rank") and ".trace.json" in n]


def _print_run(r: Run, size: int) -> None:
    state = "" if r.ok else f"  ({r.error})" if r.timed_out else f"  FAILED: {r.error}"
    print(
        f"    {r.name:<28} {r.wall_s:8.2f} s wall {r.cpu_s:8.2f} s cpu {r.peak_rss_mb:8.0f} MB peak "
        f"({r.peak_rss_mb * MB / size:.2f}x file){state}",
        flush=True,
    )


def ratios(res: dict[str, Run], size: int, which: str) -> dict[str, float | None]:
    """How `which` (an analyze run) compares: x faster in wall time (and in CPU time), memory per file byte."""
    a = res.get(which)
    if a is None:
        return {}

    def faster(name: str, cpu: bool = False) -> float | None:
        """other / analyze; negative when `other` hit the time limit (then it is a lower bound, shown as >=)."""
        other = res.get(name)
        if not (other and (other.ok or other.timed_out) and a.ok):
            return None
        if other.timed_out:
            return None if cpu else -other.wall_s / a.wall_s
        return other.cpu_s / a.cpu_s if cpu else other.wall_s / a.wall_s

    out = {
        "x faster than HTA, wall (target >= 10)": faster("HTA"),
        "x faster than HTA, cpu": faster("HTA", cpu=True),
        "x faster than orjson.loads, wall (target >= 3)": faster("orjson.loads"),
        "x faster than orjson.loads, cpu": faster("orjson.loads", cpu=True),
        "x faster than json.load, wall": faster("json.load"),
        "peak RSS / file size (target <= 0.25)": a.peak_rss_mb * MB / size if a.ok else None,
    }
    gz = res.get(f"{which} .gz")
    if gz is not None and gz.ok:
        out[".gz wall / plain wall"] = gz.wall_s / a.wall_s
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a small subset: 50 MB sim and 100 MB real traces")
    parser.add_argument("--big", action="store_true", help="also the 2 GB trace (deleted afterwards)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement; the fastest counts")
    parser.add_argument(
        "--baseline-max-mb",
        type=int,
        default=1024,
        help="skip HTA, json.load and orjson above this size (they need 6-8x the file in memory)",
    )
    parser.add_argument("--hta-timeout", type=float, default=600, help="stop HTA after this many seconds")
    parser.add_argument("--only", help="comma-separated rows to run, e.g. 'analyze (proposed),HTA'")
    parser.add_argument("--min-mb", type=int, default=0, help="skip inputs smaller than this")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else None
    print(f"building inputs in {I.DATA} ...", flush=True)
    todo = I.build(args.quick, args.big)
    report: dict = {"cpus": os.cpu_count(), "inputs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for inp in todo:
            print(f"\n{inp.name}: {inp.path} ({inp.size / MB:.0f} MB)", flush=True)
            if args.min_mb and inp.size < args.min_mb * MB:
                continue
            res = bench_input(inp, args.repeat, args.baseline_max_mb, tmp, args.hta_timeout, only)
            rat = {which: ratios(res, inp.size, which) for which in ("analyze", "analyze (proposed)")}
            for which, values in rat.items():
                print(f"  {which}:")
                for k, v in values.items():
                    shown = "-" if v is None else f">= {-v:.2f}" if v < 0 else f"{v:.2f}"
                    print(f"    {k:<48} {shown}")
            report["inputs"].append(
                {
                    "name": inp.name,
                    "size_mb": inp.size / MB,
                    "ratios": rat,
                    "runs": {k: vars(v) for k, v in res.items()},
                }
            )
        if todo[0].folder:
            print(f"\nmulti-rank set {todo[0].folder}", flush=True)
            report["ranks"] = {k: vars(v) for k, v in bench_ranks(todo[0].folder, args.repeat, tmp).items()}
    if args.big:
        for inp in todo:
            if inp.size > 1500 * MB:
                os.remove(inp.path)
    name = "results.json" if not (only or args.min_mb) else "results-partial.json"
    with open(os.path.join(I.DATA, name), "w") as f:
        json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
