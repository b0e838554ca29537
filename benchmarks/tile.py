"""Build a large trace by tiling a real one in time: each copy's timestamps are shifted past the previous copy,
and its correlation / external / flow ids and ProfilerStep numbers are renumbered, so that the result is one
consistent longer trace.

The events are copied as text (the regex rewrites only the numbers), so the output keeps Kineto's own layout.
"""

from __future__ import annotations

import gzip
import re

_EVENTS = re.compile(rb'"traceEvents"\s*:\s*\[')
_TS = re.compile(rb'"ts": *(\d+(?:\.\d+)?)')
_STEP = re.compile(rb"ProfilerStep#(\d+)")
_IDS = re.compile(rb'"(correlation|External id|external id|id|wait_on_cuda_event_record_corr_id)": *(\d+)')


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        data = f.read()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _split(text: bytes) -> tuple[bytes, bytes, bytes]:
    """header (up to and including `[`), the events body, trailer (from `]`)."""
    m = _EVENTS.search(text)
    if m is None:
        raise ValueError("no traceEvents array")
    end = text.rindex(b"]")
    return text[: m.end()], text[m.end() : end].rstrip(), text[end:]


def _span(body: bytes) -> tuple[float, float, int, int]:
    """First and last timestamp, the largest id, the number of ProfilerStep numbers."""
    stamps = [float(x) for x in _TS.findall(body)]
    ids = [int(x[1]) for x in _IDS.findall(body)]
    steps = [int(x) for x in _STEP.findall(body)]
    return min(stamps), max(stamps), max(ids, default=0), (max(steps) - min(steps) + 1) if steps else 0


def tile(source: str, target: str, size: int) -> int:
    """Write `target` (plain JSON) of about `size` bytes from copies of `source`; returns the bytes written."""
    header, body, trailer = _split(_read(source))
    lo, hi, max_id, n_steps = _span(body)
    shift_ts = hi - lo + 1000.0
    copies = max(1, round((size - len(header) - len(trailer)) / (len(body) + 2)))
    written = 0
    with open(target, "wb") as out:
        written += out.write(header)
        for k in range(copies):
            dt, di, ds = shift_ts * k, (max_id + 1) * k, n_steps * k
            if k == 0:
                chunk = body
            else:
                chunk = _TS.sub(lambda m, dt=dt: b'"ts": ' + _num(float(m.group(1)) + dt), body)
                chunk = _IDS.sub(
                    lambda m, di=di: b'"' + m.group(1) + b'": ' + str(int(m.group(2)) + di).encode(), chunk
                )
                chunk = _STEP.sub(lambda m, ds=ds: b"ProfilerStep#" + str(int(m.group(1)) + ds).encode(), chunk)
                written += out.write(b",")
            written += out.write(chunk)
        written += out.write(b"\n  " + trailer)
    return written


def _num(value: float) -> bytes:
    return str(int(value)).encode() if value.is_integer() else repr(value).encode()
