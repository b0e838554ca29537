"""Where things live in a run folder. Both the launcher and the ranks use these names."""

from __future__ import annotations

import os

RUN_JSON = "run.json"
STATUS_DIR = "status"


def trace_path(out: str, rank: int) -> str:
    return os.path.join(out, f"rank{rank}.trace.json.gz")


def summary_path(out: str, rank: int) -> str:
    return os.path.join(out, f"rank{rank}.summary.json")


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
    """Whether a top-level file name is one `overlapcheck run` writes (what --force may delete)."""
    return (
        name == RUN_JSON
        or (name.startswith("rank") and name.endswith((".trace.json.gz", ".summary.json")))
        or (name.startswith(".") and ".tmp" in name)
    )  # temp files of an interrupted write
