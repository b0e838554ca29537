"""Does `overlapcheck run` slow down the steps outside its profiling window?

Runs the tiny ZeRO-3 job of tests/jobs (2 ranks, gloo on CPU) twice with the same launcher: once plain,
once under `overlapcheck run`, and compares rank 0's step times outside the window (the window's warm-up,
recorded steps and the export step right after are left out). Prints the medians and their ratio.

    python benchmarks/capture_overhead.py [--steps 40] [--repeat 3] [--launcher torchrun|deepspeed]

Not a test: timings on a shared 2-core machine are noisy, hence several pairs in alternating order.
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


def run(cmd: list[str], cwd: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERLAPCHECK_")}
    env.update(
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
    )
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")


def step_times(path: Path) -> dict[int, float]:
    return {int(a): float(b) for a, b in (line.split() for line in path.read_text().splitlines())}


def one_pair(args: argparse.Namespace, tmp: str, rep: int) -> dict[str, float]:
    """One plain and one profiled run (order alternating between repetitions); medians in ms."""
    plain_times, prof_times, out = Path(tmp, f"plain{rep}.txt"), Path(tmp, f"prof{rep}.txt"), Path(tmp, f"run{rep}")
    job = ["--steps", str(args.steps), "--width", str(args.width)]
    plain_cmd = launch(args.launcher, [*job, "--step-times", str(plain_times)])
    prof_cmd = [
        sys.executable,
        "-m",
        "overlapcheck",
        "run",
        "--out",
        str(out),
        "--wait",
        str(args.wait),
        "--warmup",
        str(args.warmup),
        "--active",
        str(args.active),
        "--",
        *launch(args.launcher, [*job, "--step-times", str(prof_times)]),
    ]
    for cmd in (plain_cmd, prof_cmd) if rep % 2 == 0 else (prof_cmd, plain_cmd):
        run(cmd, tmp)
    plain, prof = step_times(plain_times), step_times(prof_times)
    last = args.wait + args.warmup + args.active - 1
    # step i's time includes the tick after it: the tick after step wait-1 starts the profiler and the
    # tick after step `last` exports the trace; both belong to the window, not to the steps outside it.
    inside = set(range(args.wait - 1, last + 1))
    outside = [s for s in sorted(plain) if s not in inside and s >= 1 and s in prof]  # step 0: start-up
    capture = json.loads((out / "run.json").read_text())["ranks"][0]["capture"]

    def med(times: dict[int, float], steps: list[int]) -> float:
        return statistics.median(times[s] for s in steps) * 1e3

    row = {}
    for label, steps in (
        ("before", [s for s in outside if s < args.wait - 1]),
        ("after", [s for s in outside if s > last]),
        ("outside", outside),
    ):
        row[f"{label}_plain"], row[f"{label}_prof"] = med(plain, steps), med(prof, steps)
    row["step0_plain"], row["step0_prof"] = plain[0] * 1e3, prof[0] * 1e3
    row["window_plain"] = sum(plain[s] for s in inside if s in plain) * 1e3
    row["window_prof"] = sum(prof[s] for s in inside if s in prof) * 1e3
    row["export"], row["trace_mb"] = capture["export_s"] * 1e3, capture["trace_bytes"] / 1e6
    return row


def hook_cost_us(calls: int = 200_000) -> tuple[float, float]:
    """In-process cost of the per-step hook outside the window, in microseconds per optimizer step:
    (engine step tick, plus the ignored tick of the engine's inner torch optimizer)."""
    import timeit

    from overlapcheck.capture import hook
    from overlapcheck.capture.rank import RankCapture
    from overlapcheck.capture.settings import CaptureSettings, Schedule

    with tempfile.TemporaryDirectory(prefix="oc-hook-") as tmp:
        os.environ.setdefault("RANK", "0")
        hook._controller = RankCapture(CaptureSettings(tmp, Schedule(wait=10**9)))  # what the patches call
        engine, inner = object(), object()
        hook.controller().on_step("deepspeed", engine)  # first step: identity and status file (once per run)
        tick = timeit.timeit(lambda: hook.controller().on_step("deepspeed", engine), number=calls) / calls * 1e6
        both = (
            timeit.timeit(
                lambda: (hook.controller().on_step("optimizer", inner), hook.controller().on_step("deepspeed", engine)),
                number=calls,
            )
            / calls
            * 1e6
        )
        hook._controller = None
    return tick, both


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--wait", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--active", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3, help="plain/profiled pairs (order alternates)")
    parser.add_argument("--launcher", choices=["torchrun", "deepspeed"], default="torchrun")
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()
    last = args.wait + args.warmup + args.active - 1
    tick, both = hook_cost_us()
    print(
        f"hook cost outside the window: {tick:.2f} us per engine step, {both:.2f} us with the inner "
        "optimizer's ignored tick (in-process, 200k calls)"
    )
    print(
        f"job: {args.launcher}, 2 ranks, gloo/CPU, width {args.width}, {args.steps} steps; window: steps "
        f"{args.wait}-{last} (warm-up {args.warmup}, recorded {args.active}); rank 0 medians, ms"
    )
    print(
        f"{'pair':>4s} {'before: plain':>14s} {'prof':>7s} {'ratio':>6s} {'after: plain':>13s} {'prof':>7s} "
        f"{'ratio':>6s} {'outside ratio':>13s} {'step 0 ratio':>12s} {'export':>7s}"
    )
    ratios: list[float] = []
    with tempfile.TemporaryDirectory(prefix="oc-bench-") as tmp:
        for rep in range(args.repeat):
            r = one_pair(args, tmp, rep)
            ratios.append(r["outside_prof"] / r["outside_plain"])
            print(
                f"{rep:4d} {r['before_plain']:14.2f} {r['before_prof']:7.2f} "
                f"{r['before_prof'] / r['before_plain']:6.3f} {r['after_plain']:13.2f} {r['after_prof']:7.2f} "
                f"{r['after_prof'] / r['after_plain']:6.3f} {ratios[-1]:13.3f} "
                f"{r['step0_prof'] / r['step0_plain']:12.3f} {r['export']:6.0f}ms"
            )
    print(
        f"median ratio (profiled / plain) of the steps outside the window over {args.repeat} pairs: "
        f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f}); "
        f"trace {r['trace_mb']:.2f} MB per rank"
    )


if __name__ == "__main__":
    main()
