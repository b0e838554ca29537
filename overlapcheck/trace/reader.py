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
_RANK_IN_NAME = re.compile(r"(?<![a-z])(?:rank|worker)[-_]?([0-9]+)", re.IGNORECASE)
MAX_RANK = (1 << 31) - 1  # a larger number is not a rank (and would not fit the report's integer columns)


def load_trace(path: str, progress: Callable[[int], None] | None = None, workers: int = 1) -> TraceModel:
    """Stream `path` (.json or .json.gz) into a TraceModel. Raises UserError for anything that is not a trace.

    With `workers` > 1, a big file is decoded by that many processes (the same model, see trace/fastpath.py).
    What was read but is doubtful (values out of range, a rank outside the world) is said in `model.notes`."""
    try:
        if workers > 1:
            from overlapcheck.trace import fastpath

            if fastpath.worth_parallel(path):
                return fastpath.load_parallel(path, workers, progress)
        stream = TraceStream(path, EVENTS_DECODER, progress)
        builder = ModelBuilder(path)
        for batch in stream.batches():
            builder.add(batch)
        return finish_model(builder.build(stream.metadata), stream)
    except RecursionError:  # a decoder or the metadata nested beyond the interpreter's limit
        raise UserError("nested too deeply to read", path) from None


def finish_model(model: TraceModel, stream: TraceStream) -> TraceModel:
    """The notes that only the whole file tells: its format, what the stream noticed, the rank's sanity."""
    if stream.bare_list:
        model.notes.append("torch 1.8 trace format (bare event list)")
    model.notes.extend(stream.notes)
    model.notes.extend(rank_notes(model))
    return model


def _valid_rank(value: Any) -> int | None:
    """`value` as a rank number (0 <= rank <= MAX_RANK, an int or a digit string), else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value <= MAX_RANK else None
    if isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 10:
        rank = int(value)
        return rank if rank <= MAX_RANK else None
    return None


def _shown(value: Any) -> str:
    if isinstance(value, int) and not -(10**30) < value < 10**30:
        return "(a number far beyond 64 bits)"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def valid_world(value: Any) -> int | None:
    """`value` as a world size (an int, 1 <= size <= MAX_RANK + 1), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_RANK + 1 else None


def world_of(model: TraceModel) -> int | None:
    """`distributedInfo.world_size` when it is a world size, else None (`rank_notes` says why)."""
    return valid_world(model.distributed.get("world_size"))


def rank_notes(model: TraceModel) -> list[str]:
    """Notes on a `distributedInfo.rank` that is not a rank, a `world_size` that is not a world size, or a rank
    not below the world size."""
    info = model.distributed
    notes = []
    world = world_of(model)
    if "world_size" in info and world is None:
        notes.append(f"distributedInfo.world_size {_shown(info['world_size'])} is not a world size: ignored")
    if "rank" not in info:
        return notes
    rank = _valid_rank(info["rank"])
    if rank is None:
        return [*notes, f"distributedInfo.rank {_shown(info['rank'])} is not a rank number: ignored"]
    if world is not None and world <= rank:
        notes.append(f"distributedInfo.rank {rank} is not below its world_size {world}")
    return notes


def rank_from_name(path: str) -> int | None:
    """The rank a file name states (`rank-3`, `rank3`, `worker3`), None if none; UserError if it states several."""
    found = {int(d) for m in _RANK_IN_NAME.finditer(os.path.basename(path)) if len(d := m.group(1)) <= 10}
    found = {r for r in found if r <= MAX_RANK}
    if len(found) > 1:
        raise UserError(f"ambiguous rank: the file name names ranks {sorted(found)}", path)
    return found.pop() if found else None


def rank_of(model: TraceModel) -> int | None:
    """`distributedInfo.rank` when it is a rank number, else the rank in the file name, else None."""
    rank = _valid_rank(model.distributed.get("rank"))
    return rank if rank is not None else rank_from_name(model.source)
