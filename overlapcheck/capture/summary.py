"""The per-rank summary: a one-rank `overlapcheck.report/1` document computed from the rank's own trace.

Run as `python -m overlapcheck.capture.summary --trace T --out S --status F` by each rank right after its
trace is exported, in a separate low-priority process, so that the analysis never competes with the
training loop for the GIL and can never raise into the job. `overlapcheck report RUN_DIR` concatenates
these summaries instead of re-reading every trace.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Any

from overlapcheck import __version__
from overlapcheck.capture.atomic import atomic_write_json

SCHEMA = "overlapcheck.report/1"


def summarize(trace: str) -> dict[str, Any]:
    """The one-rank report document for `trace`."""
    from overlapcheck.analysis import analyze_trace

    rank_doc = analyze_trace(trace)
    rank_doc["source"] = os.path.basename(trace)
    return {"schema": SCHEMA, "tool": {"name": "overlapcheck", "version": __version__},
            "ranks": [rank_doc], "findings": []}


def write_summary(trace: str, out: str, status: str) -> bool:
    """Write the summary to `out` and the outcome to `status`; True on success. Never raises."""
    from overlapcheck.capture.profiler import one_line

    started = time.perf_counter()
    try:
        atomic_write_json(out, summarize(trace))
        result: dict[str, Any] = {"status": "ok", "file": os.path.basename(out)}
    except Exception as exc:  # noqa: BLE001 - recorded in run.json instead
        result = {"status": "failed", "error": one_line(exc)}
    result["seconds"] = round(time.perf_counter() - started, 3)
    with contextlib.suppress(OSError):
        atomic_write_json(status, result)
    return result["status"] == "ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--status", required=True)
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError):
        os.nice(10)  # yield the CPU to the training processes
    return 0 if write_summary(args.trace, args.out, args.status) else 1


if __name__ == "__main__":
    raise SystemExit(main())
