"""Read one rank's trace file into a TraceModel, and tell which rank it is."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from overlapcheck.errors import UserError
from overlapcheck.trace.events import EVENTS_DECODER
from overlapcheck.trace.jsonstream import TraceStream
from overlapcheck.trace.model import ModelBuilder, TraceModel

# rank in a file name: rank-3, rank3, rank_3, worker3, worker_3 (not part of a longer word)
_RANK_IN_NAME = re.compile(r"(?<![a-z])(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


def load_trace(path: str, progress: Callable[[int], None] | None = None, workers: int = 1) -> TraceModel:
    """Stream `path` (.json or .json.gz) into a TraceModel. Raises UserError for anything that is not a trace.

    With `workers` > 1, a big file is decoded by that many processes (the same model, see trace/fastpath.py)."""
    if workers > 1:
        from overlapcheck.trace import fastpath

        if fastpath.worth_parallel(path):
            return fastpath.load_parallel(path, workers, progress)
    stream = TraceStream(path, EVENTS_DECODER, progress)
    builder = ModelBuilder(path)
    for batch in stream.batches():
        builder.add(batch)
    model = builder.build(stream.metadata)
    if stream.bare_list:
        model.notes.append("torch 1.8 trace format (bare event list)")
    return model


def rank_from_name(path: str) -> int | None:
    """The rank a file name states (`rank-3`, `rank3`, `worker3`), None if none; UserError if it states several."""
    found = {int(m.group(1)) for m in _RANK_IN_NAME.finditer(os.path.basename(path))}
    if len(found) > 1:
        raise UserError(f"ambiguous rank: the file name names ranks {sorted(found)}", path)
    return found.pop() if found else None


def rank_of(model: TraceModel) -> int | None:
    """`distributedInfo.rank` when present, else the rank in the file name, else None."""
    rank: Any = model.distributed.get("rank")
    if isinstance(rank, int):
        return rank
    if isinstance(rank, str) and rank.isdigit():
        return int(rank)
    return rank_from_name(model.source)
