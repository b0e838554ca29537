"""Does `overlapcheck run` slow down the steps outside its profiling window?

Runs the tiny ZeRO-3 job of tests/jobs (2 ranks, gloo on CPU) twice with the same launcher: once plain,
once under `overlapcheck run`, and compares rank 0's step times outside the window (the window's warm-up,
recorded steps and the export step right after are left out). Prints the medians and their ratio.

    python benchmarks/capture_overhead.py [--steps 40] [--launcher torchrun|deepspeed] [--width 512]

Not a test: timings on a shared 2-core machine are noisy; run it a few times.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "tests" / "jobs" / "train_zero3.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(launcher: str, job_args: list[str]) -> list[str]:
    port = str(free_port())
    if launcher == "deepspeed":
        return ["deepspeed", "--num_gpus", "2", "--master_port", port, str(TRAIN), *job_args]
    return ["torchrun", "--nproc_per_node", "2", "--master_port", port, str(TRAIN), *job_args]


def run(cmd: list[str], cwd: str) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERLAPCHECK_")}
    env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""))
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - started


def step_times(path: Path) -> dict[int, float]:
    return {int(a): float(b) for a, b in (line.split() for line in path.read_text().splitlines())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--wait", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--active", type=int, default=3)
    parser.add_argument("--launcher", choices=["torchrun", "deepspeed"], default="torchrun")
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="oc-bench-") as tmp:
        plain_times, prof_times, out = Path(tmp, "plain.txt"), Path(tmp, "profiled.txt"), Path(tmp, "run")
        job = ["--steps", str(args.steps), "--width", str(args.width)]
        plain_wall = run(launch(args.launcher, [*job, "--step-times", str(plain_times)]), tmp)
        prof_wall = run([sys.executable, "-m", "overlapcheck", "run", "--out", str(out), "--wait", str(args.wait),
                         "--warmup", str(args.warmup), "--active", str(args.active), "--",
                         *launch(args.launcher, [*job, "--step-times", str(prof_times)])], tmp)
        plain, prof = step_times(plain_times), step_times(prof_times)
        last = args.wait + args.warmup + args.active - 1
        # step i's time covers the tick after it: the tick after step wait-1 starts the profiler,
        # the tick after step `last` exports the trace; both are the window's cost, not the steps'.
        inside = set(range(args.wait - 1, last + 1))
        outside = [s for s in sorted(plain) if s not in inside and s >= 1 and s in prof]  # step 0: start-up
        before = [s for s in outside if s < args.wait - 1]
        after = [s for s in outside if s > last]
        run_json = json.loads((out / "run.json").read_text())
        rank0 = run_json["ranks"][0]["capture"]

        def med(times: dict[int, float], steps: list[int]) -> float:
            return statistics.median(times[s] for s in steps) * 1e3

        print(f"job: {args.launcher}, 2 ranks, gloo/CPU, width {args.width}, {args.steps} steps; "
              f"window: steps {args.wait}-{last} (warm-up {args.warmup}, recorded {args.active})")
        print(f"{'':28s} {'plain':>10s} {'profiled':>10s} {'ratio':>7s}")
        for label, steps in (("steps before the window", before), ("steps after the window", after),
                             ("all steps outside", outside)):
            a, b = med(plain, steps), med(prof, steps)
            print(f"{label + f' (n={len(steps)})':28s} {a:8.2f}ms {b:8.2f}ms {b / a:7.3f}")
        print(f"{'step 0 (start-up)':28s} {plain[0] * 1e3:8.2f}ms {prof[0] * 1e3:8.2f}ms {prof[0] / plain[0]:7.3f}")
        win = [s for s in sorted(inside) if s in prof]
        print(f"window + export, steps {win[0]}-{win[-1]}: plain {sum(plain[s] for s in win) * 1e3:.1f} ms, "
              f"profiled {sum(prof[s] for s in win) * 1e3:.1f} ms (export {rank0['export_s'] * 1e3:.0f} ms, "
              f"trace {rank0['trace_bytes'] / 1e6:.2f} MB)")
        print(f"wall time: plain {plain_wall:.1f} s, profiled {prof_wall:.1f} s (includes the summaries)")


if __name__ == "__main__":
    main()
