"""Run one command in a child process and measure it: wall time, CPU time and peak resident memory.

Peak RSS comes from GNU time (`/usr/bin/time`), which forks from its own small process: a child forked straight
from this (larger) benchmark process would report at least this process's RSS as its `ru_maxrss`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass


@dataclass
class Run:
    name: str
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    ok: bool
    error: str = ""
    timed_out: bool = False  # stopped at the time limit: its times are lower bounds


def measure(name: str, argv: list[str], timeout: float = 3600, env: dict[str, str] | None = None) -> Run:
    """Wall time of the whole process (start-up and imports included), its user+system CPU time (children
    included) and its peak RSS (the largest of the process and its children)."""
    gnu_time = shutil.which("time", path="/usr/bin:/bin")
    with tempfile.TemporaryDirectory() as tmp:
        stats, errors = os.path.join(tmp, "stats"), os.path.join(tmp, "stderr")
        if gnu_time:
            argv = [gnu_time, "-f", "%U %S %M", "-o", stats, *argv]
        start = time.perf_counter()
        with open(errors, "wb") as err:
            try:
                code = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=err, timeout=timeout, env=env).returncode
            except subprocess.TimeoutExpired:
                code = None
        wall = time.perf_counter() - start
        with open(errors, "rb") as f:
            lines = f.read().decode(errors="replace").strip().splitlines()
        cpu, rss = _stats(stats) if gnu_time and code is not None else (float("nan"), float("nan"))
    if code is None:
        return Run(name, wall, cpu, rss, False, f"stopped after {timeout:.0f} s", timed_out=True)
    ok = code == 0
    error = "" if ok else ([ln for ln in lines if not ln.startswith("Command exited")] or [f"exit {code}"])[-1]
    return Run(name, wall, cpu, rss, ok, error)


def _stats(path: str) -> tuple[float, float]:
    """CPU seconds and peak RSS in MiB from GNU time's `%U %S %M` line."""
    with open(path) as f:
        user, system, kib = f.read().strip().splitlines()[-1].split()
    return float(user) + float(system), int(kib) / 1024


def best(runs: list[Run]) -> Run:
    """The fastest of repeated runs (the one least disturbed by other load on the machine)."""
    good = [r for r in runs if r.ok]
    return min(good, key=lambda r: r.wall_s) if good else runs[-1]
