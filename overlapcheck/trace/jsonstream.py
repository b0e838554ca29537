"""Stream the events of a Chrome-trace JSON file in pieces, never holding the whole file in memory.

A trace is either `{"traceEvents": [...], ...metadata...}` or, from torch 1.8, a bare `[...]` event list. We
read the (possibly gzipped) bytes in chunks and hand each run of complete event objects to a typed msgspec
decoder. Everything outside the event array (a few KB of metadata) is decoded once at the end.

Where a run of events ends is found cheaply: the last `}` `,` `{` in the chunk's tail is taken as the boundary
between two events, and the decoder checks it, since `[` + run + `]` is valid JSON only when the run is a
sequence of whole events (a cut inside a string or a nested value leaves it unterminated or unbalanced). When the
guess fails, or the array closes in this chunk, a vectorized scan of the JSON structure (braces and brackets
outside strings) finds the exact ranges instead.
"""

from __future__ import annotations

import functools
import gzip
import re
import zlib
from collections.abc import Callable, Iterator
from typing import IO, Any

import msgspec
import numpy as np

from overlapcheck.errors import UserError
from overlapcheck.fsutil import open_input

CHUNK = 4 << 20
TAIL = 256 << 10  # where to look for the last event boundary of a chunk

_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[ord("{")] = _OPEN[ord("[")] = 1
_OPEN[ord("}")] = _OPEN[ord("]")] = -1
_KEY_BEFORE = re.compile(rb'"traceEvents"\s*:\s*$')
_QUOTE, _BACKSLASH = 34, 92
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_LEADING = re.compile(rb"\s*(,?)")  # what precedes the first event of a run: a comma after an earlier event


@functools.cache
def _codec_errors() -> tuple[type[BaseException], ...]:
    """ISA-L's decompression error, when python-isal is installed."""
    try:
        from isal import isal_zlib
    except ImportError:
        return ()
    return (isal_zlib.error,)


def _gzip_reader(f: IO[bytes]) -> IO[bytes]:
    """A gzip reader over `f`: ISA-L's (several times faster) when python-isal is installed, else the stdlib's."""
    try:
        from isal import igzip
    except ImportError:
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    return igzip.IGzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]


def open_bytes(path: str) -> IO[bytes]:
    """Open a `.json` or `.json.gz` trace for binary reading (gzip is detected by its magic bytes)."""
    f = open_input(path, "a trace file")
    if f.read(2) == b"\x1f\x8b":
        f.seek(0)
        return _gzip_reader(f)
    f.seek(0)
    return f


def _structure(buf: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Positions of `{ } [ ]` outside strings in `buf`, and the nesting depth after each (relative to buf start).

    `buf` must start outside any string.
    """
    arr = np.frombuffer(buf, dtype=np.uint8)
    quotes = np.flatnonzero(arr == _QUOTE)
    if len(quotes) and buf.find(b"\\") >= 0:
        quotes = _drop_escaped_quotes(buf, arr, quotes)
    delta = _OPEN[arr]
    pos = np.flatnonzero(delta)
    # a bracket is inside a string when an odd number of real quotes precede it
    outside = (np.searchsorted(quotes, pos) & 1) == 0
    pos = pos[outside]
    depth = np.cumsum(delta[pos], dtype=np.int64)
    return pos, depth


def _drop_escaped_quotes(buf: bytes, arr: np.ndarray, quotes: np.ndarray) -> np.ndarray:
    """Remove quotes preceded by an odd run of backslashes (rare: only strings that contain `\\"`)."""
    maybe = quotes[(quotes > 0) & (arr[np.maximum(quotes - 1, 0)] == _BACKSLASH)]
    escaped = []
    for q in maybe.tolist():
        run = 0
        while q - run - 1 >= 0 and buf[q - run - 1] == _BACKSLASH:
            run += 1
        if run & 1:
            escaped.append(q)
    return np.setdiff1d(quotes, np.asarray(escaped, dtype=quotes.dtype), assume_unique=True) if escaped else quotes


class TraceStream:
    """Iterate a trace file's events in decoded batches; `metadata` holds the top-level keys afterwards.

    `decoder` decodes a JSON array of events (e.g. `msgspec.json.Decoder(list[Event])`).
    `progress(n)` is called with the number of compressed-or-plain bytes read so far.
    """

    def __init__(self, path: str, decoder: msgspec.json.Decoder, progress: Callable[[int], None] | None = None):
        self.path = path
        self.decoder = decoder
        self.progress = progress
        self.metadata: dict[str, Any] = {}
        self.bare_list = False
        self._continued = False  # an earlier run of events was decoded: the next one starts with a comma

    def batches(self) -> Iterator[list]:
        """The events, decoded, in runs of whole events (about a chunk each)."""
        return self._pieces(decode=True)

    def runs(self) -> Iterator[bytearray]:
        """The events as JSON arrays (`[...]`) of about a chunk each, for decoding elsewhere (another process).

        Unlike `batches`, a guessed boundary is not checked here: decoding the run checks it. If a run fails to
        decode, its guess (or the data) was wrong: read the file with `batches` instead, which finds out which.
        """
        return self._pieces(decode=False)

    def _pieces(self, decode: bool) -> Iterator[Any]:
        path = self.path
        f = open_bytes(path)
        raw = f.fileobj if isinstance(f, gzip.GzipFile) else f  # for progress in file bytes
        header = b""  # bytes before the event array
        trailer: list[bytes] = []  # bytes after it
        carry = b""  # bytes after the last decoded event: an incomplete event, re-scanned with the next chunk
        events_depth = -1  # nesting depth inside the event array; -1 until found
        in_array = False
        done = False
        seen_any = False
        try:
            while True:
                chunk = f.read(CHUNK)
                if self.progress is not None and raw is not None:
                    self.progress(raw.tell())
                if not chunk:
                    break
                seen_any = True
                if done:
                    trailer.append(chunk)
                    continue
                if not in_array:
                    header += chunk
                    found = self._find_array(header)
                    if found is None:
                        if len(header) > (256 << 20):
                            raise UserError("not a trace: no traceEvents array in the first 256 MB", path)
                        continue
                    start, events_depth = found
                    carry = header[start:]
                    header = header[: start - 1]  # without the array's "["
                    in_array = True
                else:
                    carry += chunk
                batch, carry = self._guess_split(carry, decode)
                if batch is not None:
                    if batch:
                        yield batch
                    continue
                batch, carry, rest = self._split(carry, events_depth)
                if batch:
                    yield self._decode(batch, decode)
                if rest is not None:
                    trailer.append(rest)
                    carry = b""
                    done = True
            if in_array and not done:  # the array closes in the last bytes: find it exactly
                batch, carry, rest = self._split(carry, events_depth)
                if batch:
                    yield self._decode(batch, decode)
                if rest is not None:
                    trailer.append(rest)
                    done = True
        except (EOFError, zlib.error, gzip.BadGzipFile, *_codec_errors()) as exc:
            raise UserError(f"corrupt or truncated gzip data ({exc})", path) from None
        finally:
            f.close()
        if not seen_any:
            raise UserError("empty file", path)
        if not in_array:
            self._raise_not_trace(header)
        if not done:
            raise UserError("truncated JSON: the event array never closes", path)
        self._read_metadata(header, b"".join(trailer))

    def _guess_split(self, buf: bytes, decode: bool = True) -> tuple[Any, bytes]:
        """Decode the events of `buf` up to the last `},{` in its tail, if that is an event boundary.

        Returns (events, rest of buf), or (None, buf) when there is no such boundary or the decoder says the guess
        was wrong (or the data is malformed: the exact scan then finds and reports it). Without `decode`, the
        events are returned as an unchecked JSON array.
        """
        tail = max(0, len(buf) - TAIL)
        last = None
        for last in _BOUNDARY.finditer(buf, tail):  # noqa: B007 - only the last match is wanted
            pass
        if last is None:
            return None, buf
        cut = last.start() + 1
        body = bytearray(b"[")
        lead = _LEADING.match(buf)
        if lead is None or bool(lead.group(1)) != self._continued:
            return None, buf
        body += memoryview(buf)[lead.end() : cut]
        body += b"]"
        if not decode:
            self._continued = True
            return body, buf[cut:]
        try:
            events = self.decoder.decode(body)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None, buf
        self._continued = True
        return events, buf[cut:]

    def _find_array(self, header: bytes) -> tuple[int, int] | None:
        """Byte offset just inside the event array and the depth there, or None if not in `header` yet."""
        stripped = header.lstrip()
        if not stripped:
            return None
        if stripped[:1] == b"[":
            self.bare_list = True
            return header.index(b"[") + 1, 1
        if stripped[:1] != b"{":
            self._raise_not_trace(header)
        pos, depth = _structure(header)
        opens = pos[(depth == 2) & (np.frombuffer(header, np.uint8)[pos] == ord("["))]
        for p in opens.tolist():
            if _KEY_BEFORE.search(header, max(0, p - 64), p):
                return p + 1, 1
        return None

    def _split(self, buf: bytes, depth0: int) -> tuple[bytes, bytes, bytes | None]:
        """Split `buf` (starting just inside the array, between events) into complete events, the incomplete
        tail, and, when the array closes in `buf`, the bytes after it."""
        pos, depth = _structure(buf)
        # depth relative to buf start; 0 = between events, -1 = the array closed
        closes = np.flatnonzero(depth < 0)
        rest = None
        if len(closes):
            end_idx = closes[0]
            close_at = int(pos[end_idx])
            rest = buf[close_at + 1 :]
            pos, depth = pos[:end_idx], depth[:end_idx]
            buf_end = close_at
        else:
            buf_end = len(buf)
        ends = pos[depth == 0]
        if rest is not None:
            body = buf[:buf_end].strip()
            if body.endswith(b","):
                body = body[:-1]
            return body, b"", rest
        if not len(ends):
            return b"", buf, None
        last = int(ends[-1]) + 1
        return buf[:last].strip(), buf[last:], None

    def _decode(self, body: bytes, decode: bool = True) -> Any:
        if body.startswith(b","):
            body = body[1:]
        elif self._continued:
            raise UserError("malformed JSON: no ',' between two events", self.path)
        self._continued = True
        if not decode:
            return b"[" + body + b"]"
        try:
            return self.decoder.decode(b"[" + body + b"]")
        except msgspec.ValidationError as exc:
            raise UserError(f"unexpected event field type ({exc})", self.path) from None
        except msgspec.DecodeError as exc:
            raise UserError(f"malformed JSON ({exc})", self.path) from None

    def _read_metadata(self, header: bytes, trailer: bytes) -> None:
        if self.bare_list:
            return
        try:
            meta = msgspec.json.decode(header + b"[]" + trailer)
        except msgspec.DecodeError as exc:
            raise UserError(f"malformed JSON around the event array ({exc})", self.path) from None
        if isinstance(meta, dict):
            meta.pop("traceEvents", None)
            self.metadata = meta

    def _raise_not_trace(self, header: bytes) -> None:
        try:
            doc = msgspec.json.decode(header)
        except msgspec.DecodeError:
            raise UserError("not a trace: malformed or truncated JSON with no traceEvents array", self.path) from None
        kind = type(doc).__name__
        raise UserError(f"not a trace: a JSON {kind} without a traceEvents array", self.path)
