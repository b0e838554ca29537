"""The per-rank summary: a one-rank `overlapcheck.report/1` document computed from the rank's own trace.

Run as `python -m overlapcheck.capture.summary --trace T --out S --status F` by each rank right after its
trace is exported, in a separate low-priority process, so that the analysis never competes with the
training loop for the GIL and can never raise into the job. `overlapcheck report RUN_DIR` concatenates
these summaries instead of re-reading every trace.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import time
from typing import TYPE_CHECKING, Any

from overlapcheck.capture.atomic import atomic_write_bytes, atomic_write_json, read_json
from overlapcheck.errors import UserError

if TYPE_CHECKING:
    from overlapcheck.model import Report


def summarize(trace: str, ds_config: dict[str, Any] | None = None) -> Report:
    """The one-rank Report of `trace`: its metrics, that rank's own findings and its collective signature
    (`collective_signatures`, for the cross-rank rules of `overlapcheck report`)."""
    import dataclasses

    from overlapcheck.job import JobContext
    from overlapcheck.pipeline import Inputs, Options, analyze_inputs

    job = JobContext.build(ds_config, None)
    report = analyze_inputs(Inputs(traces=[trace]), job, Options(signatures=True), jobs=1)
    if report.errors:
        raise UserError(report.errors[0].error)
    ranks = [dataclasses.replace(r, source=os.path.basename(trace)) for r in report.ranks]
    return dataclasses.replace(report, ranks=ranks)


def write_summary(trace: str, out: str, status: str, rank_status: str | None = None) -> bool:
    """Write the summary to `out` and the outcome to `status`; True on success. Never raises.

    `rank_status` is the rank's status file, whose resolved ds_config the diagnosis rules may use."""
    from overlapcheck.capture.profiler import one_line

    started = time.perf_counter()
    try:
        config = (read_json(rank_status) or {}).get("ds_config") if rank_status else None
        from overlapcheck.report.json import JsonRenderer

        data = JsonRenderer(digits=None).render(summarize(trace, config)).encode()
        atomic_write_bytes(out, data)
        # run.json records the digest: `overlapcheck report` then never takes another job's summary for this one
        result: dict[str, Any] = {
            "status": "ok",
            "file": os.path.basename(out),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
    except Exception as exc:  # noqa: BLE001 - recorded in run.json instead
        result = {"status": "failed", "error": one_line(exc)}
    result["seconds"] = round(time.perf_counter() - started, 3)
    with contextlib.suppress(OSError, UserError):
        atomic_write_json(status, result)
    return result["status"] == "ok"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--status", required=True)
    parser.add_argument("--rank-status", default=None)
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError):
        os.nice(10)  # yield the CPU to the training processes
    return 0 if write_summary(args.trace, args.out, args.status, args.rank_status) else 1


if __name__ == "__main__":
    raise SystemExit(main())
