"""Where things live in a run folder. Both the launcher and the ranks use these names.

RUN_DIR/run.json                      the run manifest
RUN_DIR/rank<R>.summary.json          each rank's own analysis (what `overlapcheck report` reads)
RUN_DIR/traces/rank<R>.pt.trace.json.gz   the traces, alone in their folder, named as torch names them, so
                                      that HolisticTraceAnalysis (`TraceAnalysis(trace_dir=RUN_DIR/traces)`),
                                      TensorBoard's profiler plugin (`--logdir RUN_DIR`) and TraceLens open them
RUN_DIR/status/                       per-rank and per-launcher status files
"""

from __future__ import annotations

import os
import re

RUN_JSON = "run.json"
STATUS_DIR = "status"
TRACES_DIR = "traces"
# a trace being exported: `.rank<R>.<host>.<pid>.tmp.gz` (torch gzips only a path ending in .gz). It never
# matches a trace pattern (*.json, *.json.gz), so a killed export is never read as a trace
TRACE_TMP = re.compile(r"^\.rank([0-9]+)\.(.+)\.([0-9]+)\.tmp\.gz$")


def traces_dir(out: str) -> str:
    return os.path.join(out, TRACES_DIR)


def trace_path(out: str, rank: int) -> str:
    return os.path.join(out, TRACES_DIR, f"rank{rank}.pt.trace.json.gz")


def summary_path(out: str, rank: int) -> str:
    return os.path.join(out, f"rank{rank}.summary.json")


def trace_tmp_path(out: str, rank: int, host: str, pid: int) -> str:
    """Where rank `rank` (process `pid` on `host`) exports its trace before renaming it to `trace_path`."""
    return os.path.join(out, TRACES_DIR, f".rank{rank}.{host}.{pid}.tmp.gz")


def rank_owner_path(out: str, rank: int) -> str:
    """The claim of the one process that captures rank `rank` (created exclusively; see RankCapture)."""
    return os.path.join(out, STATUS_DIR, f"rank{rank}.owner")


def rank_status_path(out: str, rank: int) -> str:
    """Written only by rank `rank`."""
    return os.path.join(out, STATUS_DIR, f"rank{rank}.json")


def summary_status_path(out: str, rank: int) -> str:
    """Written only by rank `rank`'s summary process."""
    return os.path.join(out, STATUS_DIR, f"rank{rank}.summary.json")


def summary_log_path(out: str, rank: int) -> str:
    return os.path.join(out, STATUS_DIR, f"rank{rank}.summary.log")


def launcher_status_path(out: str, node_rank: int) -> str:
    """Written only by the `overlapcheck run` process of node `node_rank`."""
    return os.path.join(out, STATUS_DIR, f"launcher{node_rank}.json")


def ds_env_file_path(out: str, node_rank: int) -> str:
    return os.path.join(out, STATUS_DIR, f"deepspeed_env.node{node_rank}")


def is_run_file(name: str) -> bool:
    """Whether a top-level file name is one `overlapcheck run` writes (what --force may delete): the traces are
    written in traces/, never beside run.json, so a trace there is someone else's and is kept."""
    return (
        name == RUN_JSON
        or (name.startswith("rank") and name.endswith(".summary.json"))
        or (name.startswith(".") and ".tmp" in name)
    )  # temp files of an interrupted write


_OWN_TRACE = re.compile(r"^rank[0-9]+\.pt\.trace\.json\.gz$")
_OWN_STATUS = re.compile(
    r"^(rank[0-9]+\.(owner|json|summary\.json|summary\.log)|launcher[0-9]+\.json|deepspeed_env\.node[0-9]+)$"
)


def is_own_trace(name: str) -> bool:
    """Whether a file name in traces/ is one `overlapcheck run` writes: a rank's trace or its export in flight."""
    return bool(_OWN_TRACE.match(name) or TRACE_TMP.match(name))


def is_own_status(name: str) -> bool:
    """Whether a file name in status/ is one `overlapcheck run` writes (a status record, a claim, a log, a
    DeepSpeed env file, or the temp file of an interrupted write)."""
    return bool(_OWN_STATUS.match(name) or (name.startswith(".") and ".tmp" in name))
