"""Read one big trace with several processes: the file is split into runs of whole events, other processes
decode and tabulate the runs, and this one merges their tables in file order.

The model is the one `load_trace` builds alone (same rows, same name and thread numbering): `ModelBuilder.merge`
replays each part's names and threads in order. A run is cut at a guessed event boundary that only decoding can
check; when a worker cannot decode its run, the whole file is read again the plain way, which tells a wrong guess
(rare: a `},{` inside a string at a chunk's end) from malformed data and reports the latter as usual.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import stat
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

import msgspec

from overlapcheck.errors import UserError
from overlapcheck.fsutil import open_input
from overlapcheck.trace.events import EVENTS_DECODER
from overlapcheck.trace.jsonstream import TraceStream
from overlapcheck.trace.model import ModelBuilder, TraceModel, release_free_memory

MIN_BYTES = 256 << 20  # below this, the processes cost about what they save (measured: docs/performance.md)
TRIM_EVERY = 16  # merged parts between two returns of the freed heap to the system (about 64 MB of JSON)


class _BadRun(Exception):
    """A worker could not decode its run."""


def _tabulate(run: bytes | bytearray) -> dict[str, Any] | None:
    """Worker: one run of events -> the part of the model it makes; None if the run does not decode."""
    try:
        events = EVENTS_DECODER.decode(run)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    builder = ModelBuilder("")
    builder.add(events)
    return builder.part()


def worth_parallel(path: str) -> bool:
    """Whether a file is big enough for several processes (its size on disk; a .gz is about 10x larger).
    Only a regular file is opened (a FIFO would block); anything else is left to the plain reader to report."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size * 8 < MIN_BYTES:
            return False
        with open_input(path, "a trace file") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        size = st.st_size
    except (OSError, ValueError, UserError):
        return False  # the plain reader reports it
    return size * (8 if gzipped else 1) >= MIN_BYTES


def load_parallel(path: str, workers: int, progress: Callable[[int], None] | None = None) -> TraceModel:
    """Like `reader.load_trace(path)`, with `workers` processes decoding (plus this one reading and merging)."""
    stream = TraceStream(path, EVENTS_DECODER, progress)
    builder = ModelBuilder(path)
    context = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
            pending: deque[Future[dict[str, Any] | None]] = deque()
            merged = 0
            for run in stream.runs():
                pending.append(pool.submit(_tabulate, run))
                while len(pending) > 2 * workers:  # bounded: the file is never held whole
                    merged = _merge(builder, pending.popleft(), merged)
            while pending:
                merged = _merge(builder, pending.popleft(), merged)
    except (_BadRun, UserError):
        # a run did not decode, or a wrong guess misled the split that followed it: read it plainly, which
        # reports real errors
        return _load_plain(path, progress)
    from overlapcheck.trace.reader import finish_model

    return finish_model(builder.build(stream.metadata), stream)


def _merge(builder: ModelBuilder, future: Future[dict[str, Any] | None], merged: int) -> int:
    """Merge the next part; returns the count of parts merged. The unpickled parts leave heap holes that the
    growing columns cannot reuse, so the freed heap goes back to the system every TRIM_EVERY parts."""
    part = future.result()
    if part is None:
        raise _BadRun
    builder.merge(part)
    del part
    if (merged + 1) % TRIM_EVERY == 0:
        release_free_memory()
    return merged + 1


def _load_plain(path: str, progress: Callable[[int], None] | None) -> TraceModel:
    from overlapcheck.trace.reader import load_trace

    return load_trace(path, progress)
