"""The cost per rank in the main process: `analyze --format json -o` over folders of tiny ranks
(benchmarks/tiny.py), locally (the process pool) and on a 2-worker Dask LocalCluster (`--scheduler`).

    .venv/bin/python -m benchmarks.scale                  # 100, 1k and 10k ranks, local and Dask (~10 min on 2 cores)
    .venv/bin/python -m benchmarks.scale --ranks 100,1000 # quicker
    .venv/bin/python -m benchmarks.scale --big            # also 50k ranks (about 1 GB of traces; long)
    .venv/bin/python -m benchmarks.scale --where 256      # where the main process's memory goes (tracemalloc)
    .venv/bin/python -m benchmarks.scale --merge-only     # the main process alone at 1k, 10k, 50k (a few minutes)
    .venv/bin/python -m benchmarks.scale --where 64 --steps 20   # the same with 20 profiled steps a rank

Each run is its own process (`python -m overlapcheck analyze DIR --format json -o OUT`, in-process through the
CLI's entry point so its own peak RSS is measured, without the pool's worker processes or the cluster's):
wall time, peak RSS of the main process, and per added rank the slope of the peak from the previous run,
which is what the issue's target (<= 30 KB per added rank) is about. `--merge-only` measures the main process
alone up to 50k ranks without analyzing 50k files: 100 ranks analyzed once, their results copied to N ranks as
they would arrive, held, merged and written. Inputs are built once under benchmarks/data/tiny-N/ (git-ignored).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

from benchmarks.tiny import tiny_set

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child(folder: str, out: str, scheduler: str | None) -> None:
    """One measured run (in its own process): the CLI on `folder`, then its wall time and peak RSS as JSON."""
    from overlapcheck.cli import main

    args = ["analyze", folder, "--format", "json", "-o", out, "--force"]
    if scheduler:
        args += ["--scheduler", scheduler]
    start = time.perf_counter()
    try:
        main(args, standalone_mode=False)
    except SystemExit as exc:  # exit 2: an input could not be read (never, on these inputs)
        if exc.code:
            raise
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # MiB (Linux: KiB)
    print(json.dumps({"wall_s": wall, "peak_mb": peak}))


def measure(folder: str, scheduler: str | None) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": ROOT, "NO_COLOR": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "benchmarks.scale", "--child", folder, os.path.join(tmp, "r.json")]
        if scheduler:
            cmd.append(scheduler)
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def start_cluster():  # noqa: ANN201 (distributed is optional)
    """A LocalCluster of 2 single-threaded worker processes on loopback that import this checkout."""
    os.environ["PYTHONPATH"] = ROOT
    from distributed import LocalCluster

    return LocalCluster(n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None)


def where(n: int, steps: int = 4) -> None:
    """tracemalloc of the main process: what it holds after the analysis and its peak while writing the JSON,
    by allocation site."""
    import tracemalloc

    from overlapcheck import pipeline
    from overlapcheck.report.json import JsonRenderer

    folder = tiny_set(n, steps=steps)
    inputs = pipeline.find_inputs([folder])
    job = pipeline.job_context(inputs)
    tracemalloc.start(4)
    before = tracemalloc.take_snapshot()
    report = pipeline.analyze_inputs(inputs, job, pipeline.Options())
    held, peak = tracemalloc.get_traced_memory()
    after = tracemalloc.take_snapshot()
    tracemalloc.reset_peak()
    renderer = JsonRenderer()
    size = sum(len(chunk) for chunk in renderer.stream(report))
    _, render_peak = tracemalloc.get_traced_memory()
    held_kb, peak_kb = held / n / 1024, peak / n / 1024
    print(f"{n} ranks of {steps} steps: held after the analysis {held_kb:.1f} KB/rank (peak {peak_kb:.1f});")
    print(f"  writing the JSON ({size / n / 1024:.1f} KB/rank of text) peaks at {render_peak / n / 1024:.1f} KB/rank")
    for stat in after.compare_to(before, "lineno")[:12]:
        print(f"  {stat.size_diff / n / 1024:7.2f} KB/rank  {stat.traceback[0]}")


def merge_child(n: int, steps: int = 4) -> None:
    """The main process's share alone at `n` ranks: the 100 tiny ranks analyzed once, their results copied to
    `n` ranks as if `n` had arrived (each its own objects, as unpickled ones are), held as they arrive, merged,
    the JSON report streamed to /dev/null. Peak RSS, wall and CPU time (this process), time of the merge."""
    import dataclasses
    import pickle

    from overlapcheck import pipeline
    from overlapcheck.compact import Compactor
    from overlapcheck.report.json import JsonRenderer

    folder = tiny_set(100, steps=steps)
    inputs = pipeline.find_inputs([folder])
    job = pipeline.job_context(inputs)
    options = pipeline.Options()
    blobs = [pickle.dumps(pipeline._worker(p, job, options)[1][0]) for p in inputs.traces]
    compactor = Compactor()
    start, cpu = time.perf_counter(), time.process_time()
    outcomes = []
    for i in range(n):
        r = pickle.loads(blobs[i % len(blobs)])
        m = dataclasses.replace(r.metrics, rank=i, world_size=n, source=f"{folder}/rank{i}.trace.json")
        outcomes.append((m.source, [compactor.result(dataclasses.replace(r, metrics=m))], None))
    held = time.perf_counter() - start
    report = pipeline.build_report(outcomes, inputs, job, options)
    merged = time.perf_counter() - start
    with open(os.devnull, "w") as out:
        out.writelines(JsonRenderer().stream(report))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"wall_s": wall, "cpu_s": cpu, "arrive_s": held, "merge_s": merged - held, "peak_mb": peak}))


def merge_only(counts: list[int], steps: int = 4) -> None:
    head = f"{'main process only':<18}{'ranks':>8}{'wall s':>9}{'CPU s':>9}{'merge s':>9}{'CPU ms/rank':>12}"
    print(head + f"{'peak MB':>9}{'KB/added rank':>15}")
    prev: tuple[int, float] | None = None
    env = {**os.environ, "PYTHONPATH": ROOT}
    for n in counts:
        cmd = [sys.executable, "-m", "benchmarks.scale", "--merge-child", str(n), str(steps)]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        slope = f"{(r['peak_mb'] - prev[1]) * 1024 / (n - prev[0]):.1f}" if prev else ""
        prev = (n, r["peak_mb"])
        per = r["cpu_s"] / n * 1000
        line = f"{'':<18}{n:>8}{r['wall_s']:>9.1f}{r['cpu_s']:>9.1f}{r['merge_s']:>9.1f}{per:>12.2f}"
        line += f"{r['peak_mb']:>9.1f}{slope:>15}  (load {os.getloadavg()[0]:.1f})"
        print(line, flush=True)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--merge-child":
        merge_child(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 4)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="100,1000,10000", help="rank counts, comma-separated (the first: base)")
    parser.add_argument("--big", action="store_true", help="also 50,000 ranks")
    parser.add_argument("--no-dask", action="store_true", help="local runs only")
    parser.add_argument("--where", type=int, metavar="N", help="only the tracemalloc breakdown at N ranks")
    parser.add_argument(
        "--merge-only", action="store_true", help="only the main process's share (arrival, merge, JSON) at 1k-50k"
    )
    parser.add_argument(
        "--steps", type=int, default=4, help="profiled steps per tiny rank (--where and --merge-only; default 4)"
    )
    args = parser.parse_args()
    if args.where:
        where(args.where, args.steps)
        return 0
    counts = [int(n) for n in args.ranks.split(",")] + ([50_000] if args.big else [])
    if args.merge_only:
        merge_only(sorted({1000, *counts[1:], 50_000}), args.steps)
        return 0
    folders = {n: tiny_set(n) for n in counts}
    modes: list[tuple[str, str | None]] = [("local", None)]
    cluster = None
    if not args.no_dask:
        cluster = start_cluster()
        modes.append(("dask 2 workers", cluster.scheduler_address))
    try:
        print(f"{'mode':<16}{'ranks':>8}{'wall s':>9}{'ms/rank':>9}{'peak MB':>9}{'KB/added rank':>15}")
        for label, address in modes:
            prev: tuple[int, dict[str, float]] | None = None
            for n in counts:
                r = measure(folders[n], address)
                # the slope from the previous run: the first one's peak is mostly start-up (imports, the pool)
                slope = f"{(r['peak_mb'] - prev[1]['peak_mb']) * 1024 / (n - prev[0]):.1f}" if prev else ""
                prev = (n, r)
                per = r["wall_s"] / n * 1000
                print(f"{label:<16}{n:>8}{r['wall_s']:>9.1f}{per:>9.2f}{r['peak_mb']:>9.1f}{slope:>15}", flush=True)
    finally:
        if cluster is not None:
            cluster.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
