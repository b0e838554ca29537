"""Stream the events of a Chrome-trace JSON file in pieces, never holding the whole file in memory.

A trace is either `{"traceEvents": [...], ...metadata...}` or, from torch 1.8, a bare `[...]` event list. We
read the (possibly gzipped) bytes in chunks and hand each run of complete event objects to a typed msgspec
decoder. Everything outside the event array (a few KB of metadata) is decoded once at the end.

Where a run of events ends is found cheaply: the last `}` `,` `{` in the chunk's tail is taken as the boundary
between two events, and the decoder checks it, since `[` + run + `]` is valid JSON only when the run is a
sequence of whole events (a cut inside a string or a nested value leaves it unterminated or unbalanced). When the
guess fails, or the array closes in this chunk, a vectorized scan of the JSON structure (braces and brackets
outside strings) finds the exact ranges instead.

Hostile input stays bounded in memory and linear in time: the structure scan resumes where it stopped instead of
re-reading a growing buffer, whitespace between events is collapsed, and no event, header or trailer may exceed
MAX_EVENT / MAX_METADATA bytes (a clear UserError instead of reading a 1 GB run of `[` into memory). Nesting
deeper than the decoder's recursion limit is a UserError too; what is read but doubtful (a second `traceEvents`
key) is recorded in `notes`.
"""

from __future__ import annotations

import functools
import gzip
import re
import sys
import zlib
from collections.abc import Callable, Iterator
from typing import IO, Any, cast

import msgspec
import numpy as np

from overlapcheck.errors import UserError
from overlapcheck.fsutil import open_input

CHUNK = 4 << 20
TAIL = 256 << 10  # where to look for the last event boundary of a chunk
MAX_EVENT = 64 << 20  # bytes without one complete event: no trace event is this large
MAX_METADATA = 64 << 20  # bytes before the event array, and after it (a trace's metadata is a few KB)

_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[ord("{")] = _OPEN[ord("[")] = 1
_OPEN[ord("}")] = _OPEN[ord("]")] = -1
_KEY_ARRAY = re.compile(rb'"traceEvents"\s*:\s*\[')  # the key of the event array and its opening bracket
_KEY = re.compile(rb'"traceEvents"\s*:')
_FIRST = re.compile(rb"\s*(\S)")
_WHITESPACE_RUN = re.compile(rb"\s{2,}")
_BOM = b"\xef\xbb\xbf"
_QUOTE, _BACKSLASH = 34, 92
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_LEADING = re.compile(rb"\s*(,?)")  # what precedes the first event of a run: a comma after an earlier event
# a \\uD800-\\uDFFF escape that is not half of a pair (high then low), after an even run of backslashes (a real escape)
_LONE_SURROGATE = re.compile(
    rb"(?<!\\)((?:\\\\)*)\\u(?:d[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2})|(?<!\\ud[89ab][0-9a-f]{2}\\u)d[c-f][0-9a-f]{2})",
    re.IGNORECASE,
)
_GUESS_ERRORS = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


@functools.cache
def _codec_errors() -> tuple[type[BaseException], ...]:
    """The decompression errors: the standard library's, and ISA-L's when python-isal is installed."""
    errors: tuple[type[BaseException], ...] = (EOFError, zlib.error, gzip.BadGzipFile)
    try:
        from isal import isal_zlib
    except ImportError:
        return errors
    return (*errors, cast("type[BaseException]", isal_zlib.error))


def _gzip_reader(f: IO[bytes]) -> IO[bytes]:
    """A gzip reader over `f`: ISA-L's (several times faster) when python-isal is installed, else the stdlib's."""
    try:
        from isal import igzip
    except ImportError:
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    return igzip.IGzipFile(fileobj=f, mode="rb")


def open_bytes(path: str) -> IO[bytes]:
    """Open a `.json` or `.json.gz` trace for binary reading (gzip is detected by its magic bytes)."""
    f = open_input(path, "a trace file")
    head = f.read(6)
    if head[:2] == b"\x1f\x8b":
        f.seek(0)
        return _gzip_reader(f)
    for magic, kind, tool in _OTHER_COMPRESSIONS:
        if head.startswith(magic):
            f.close()
            raise UserError(f"a {kind} file, not a trace: decompress it ({tool}) or recompress it with gzip", path)
    f.seek(0)
    return f


# compressions a trace may come in that the reader does not open (a `.json.gz` that is not gzip was "malformed JSON")
_OTHER_COMPRESSIONS = (
    (b"BZh", "bzip2", "bunzip2"),
    (b"\xfd7zXZ\x00", "xz", "unxz"),
    (b"\x28\xb5\x2f\xfd", "zstd", "unzstd"),
    (b"PK\x03\x04", "zip", "unzip"),
)


def _structure(
    buf: bytes, start: int = 0, in_string: bool = False, stop: int | None = None
) -> tuple[np.ndarray, np.ndarray, bool]:
    """Positions of `{ } [ ]` outside strings in `buf[start:stop]`, the nesting depth after each (relative to
    the depth at `start`), and whether `stop` is inside a string.

    `buf` must start outside any string; `in_string` says whether `start` is inside one (a scan resumed where
    an earlier one of the same buffer stopped, so that a growing buffer is scanned once, not once per chunk).
    """
    arr = np.frombuffer(buf, dtype=np.uint8)
    stop = len(buf) if stop is None else stop
    seg = arr[start:stop]
    quotes = np.flatnonzero(seg == _QUOTE)
    if len(quotes):
        quotes += start
        if buf.find(b"\\", max(0, start - 1), stop) >= 0:
            quotes = _drop_escaped_quotes(buf, arr, quotes, start, stop)
    delta = _OPEN[seg]
    pos = np.flatnonzero(delta)
    # a bracket is inside a string when an odd number of real quotes precede it (counted from `start`)
    outside = (np.searchsorted(quotes, pos + start) & 1) == int(in_string)
    pos = pos[outside]
    depth = np.cumsum(delta[pos], dtype=np.int64)
    return pos + start, depth, in_string ^ bool(len(quotes) & 1)


def _drop_escaped_quotes(buf: bytes, arr: np.ndarray, quotes: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Remove the quotes of `arr[start:stop]` preceded by an odd run of backslashes (rare: only strings that
    contain `\\"`). Vectorized: the run before each such quote ends at the last other byte before it."""
    maybe = quotes[(quotes > 0) & (arr[np.maximum(quotes - 1, 0)] == _BACKSLASH)]
    if not len(maybe):
        return quotes
    others = np.flatnonzero(arr[start:stop] != _BACKSLASH) + start  # each quote is one of them
    before = np.searchsorted(others, maybe) - 1
    runs = maybe - others[np.maximum(before, 0)] - 1
    for i in np.flatnonzero(before < 0).tolist():  # a run from the segment's start may begin before it
        runs[i] = _backslashes_before(buf, int(maybe[i]))
    escaped = maybe[(runs & 1) == 1]
    return np.setdiff1d(quotes, escaped, assume_unique=True) if len(escaped) else quotes


def _backslashes_before(buf: bytes, q: int) -> int:
    """The length of the run of backslashes that ends just before `buf[q]` (C-speed, even for a long run)."""
    window = 16
    while True:
        lo = max(0, q - window)
        piece = buf[lo:q]
        run = len(piece) - len(piece.rstrip(b"\\"))
        if run < len(piece) or lo == 0:
            return run
        window *= 8


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
        self.notes: list[str] = []  # what was read but is doubtful (TraceModel.notes)
        self.lone_surrogates = 0  # lone UTF-16 surrogate escapes read as U+FFFD (_without_lone_surrogates)
        self._continued = False  # an earlier run of events was decoded: the next one starts with a comma
        # how far the incomplete part of the carried bytes was already scanned: (offset, depth there, in a string)
        self._resume: tuple[int, int, bool] = (0, 0, False)
        self._header_scan: tuple[int, int, bool] = (0, 0, False)  # the same, for the bytes before the array
        self._header_searched = 0  # bytes of the header already searched for the traceEvents key
        self._first: bytes | None = None  # the first non-blank byte of the file

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
        trailer_bytes = 0
        carry = b""  # bytes after the last decoded event: an incomplete event, scanned further with the next chunk
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
                if not seen_any and chunk.startswith(_BOM):
                    chunk = chunk[len(_BOM) :]  # a UTF-8 byte order mark (a file saved by a Windows editor)
                seen_any = True
                if done:
                    trailer_bytes += len(chunk)
                    if trailer_bytes > MAX_METADATA:
                        raise UserError(
                            f"not a trace: more than {MAX_METADATA >> 20} MB of data after the event array", path
                        )
                    trailer.append(chunk)
                    continue
                if not in_array:
                    header += chunk
                    found = self._find_array(header)
                    if found is None:
                        if len(header) > MAX_METADATA:
                            raise UserError(
                                f"not a trace: no traceEvents array in the first {MAX_METADATA >> 20} MB", path
                            )
                        continue
                    carry = header[found:]
                    header = header[: found - 1]  # without the array's "["
                    in_array = True
                else:
                    carry += chunk
                if self._resume[0] <= TAIL:  # not inside a long incomplete event: the cheap guess first
                    batch, carry = self._guess_split(carry, decode)
                    if batch is not None:
                        self._resume = (0, 0, False)
                        if batch:
                            yield batch
                        continue
                batch, carry, rest = self._split(carry)
                if batch:
                    yield self._decode(batch, decode)
                if rest is not None:
                    trailer.append(rest)
                    carry = b""
                    done = True
            if in_array and not done:  # the array closes in the last bytes: find it exactly
                batch, carry, rest = self._split(carry)
                if batch:
                    yield self._decode(batch, decode)
                if rest is not None:
                    trailer.append(rest)
                    done = True
        except _codec_errors() as exc:
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
        if self.lone_surrogates:
            self.notes.append(
                f"{self.lone_surrogates} lone UTF-16 surrogate escapes in strings (no Unicode character) were read as "
                "U+FFFD"
            )

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
        except _GUESS_ERRORS:
            return None, buf
        self._continued = True
        return events, buf[cut:]

    def _find_array(self, header: bytes) -> int | None:
        """Byte offset just inside the event array, or None if it is not in `header` yet.

        Called with a growing header; each call searches only the new bytes for the `"traceEvents": [` key and
        scans the structure (to tell the top-level key from one inside a string or a nested object) only up to
        where such a key appears, resuming where the previous scan stopped."""
        if self._first is None:
            m = _FIRST.match(header, self._header_searched)  # only blanks before: linear, not quadratic
            if m is None:
                self._header_searched = len(header)
                return None
            self._first = m.group(1)
        if self._first == b"[":
            self.bare_list = True
            return header.index(b"[") + 1
        if self._first != b"{":
            self._raise_not_trace(header)
        searched, self._header_searched = self._header_searched, len(header)
        keys = [m.end() - 1 for m in _KEY_ARRAY.finditer(header, max(0, searched - 256))]
        keys = [p for p in keys if p >= searched]  # the ones seen before were checked then
        if not keys:
            return None
        offset, depth0, in_string = self._header_scan
        while offset < len(header):  # in blocks: the scan's arrays stay a few times CHUNK at most
            stop = min(len(header), offset + CHUNK)
            pos, depth, in_string = _structure(header, offset, in_string, stop)
            depth += depth0
            at = np.searchsorted(pos, keys)
            for p, i in zip(keys, at.tolist(), strict=True):
                if i < len(pos) and int(pos[i]) == p and int(depth[i]) == 2:  # `[` inside the top-level object
                    return p + 1
            offset, depth0 = stop, int(depth[-1]) if len(depth) else depth0
            self._header_scan = (offset, depth0, in_string)
        return None

    def _split(self, buf: bytes) -> tuple[bytes, bytes, bytes | None]:
        """Split `buf` (starting just inside the array, between events) into complete events, the incomplete
        tail, and, when the array closes in `buf`, the bytes after it.

        The scan resumes where the previous one stopped (`self._resume`), so an event that spans many chunks is
        scanned once; a run of bytes with no complete event is bounded by MAX_EVENT."""
        offset, depth0, in_string = self._resume
        pos, depth, in_string_end = _structure(buf, offset, in_string)
        depth += depth0  # depth relative to buf start; 0 = between events, -1 = the array closed
        closes = np.flatnonzero(depth < 0)
        if len(closes):
            close_at = int(pos[closes[0]])
            self._resume = (0, 0, False)
            body = buf[:close_at].strip()
            if body.endswith(b","):
                body = body[:-1]
            return body, b"", buf[close_at + 1 :]
        ends = pos[depth == 0]
        final_depth = int(depth[-1]) if len(depth) else depth0
        if not len(ends):
            if final_depth == 0 and not in_string_end and len(buf) > TAIL:
                # only separators (and stray scalars) since the last event: collapse the blank runs
                buf = _WHITESPACE_RUN.sub(b" ", buf)
            if len(buf) > MAX_EVENT:
                raise UserError(
                    f"no complete event in {MAX_EVENT >> 20} MB of the event array: "
                    "an event that large, or data that is not trace events",
                    self.path,
                )
            self._resume = (len(buf), final_depth, in_string_end)
            return b"", buf, None
        last = int(ends[-1]) + 1
        # what follows the last complete event was scanned already: resume after it
        self._resume = (len(buf) - last, final_depth, in_string_end)
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
            events = self._without_lone_surrogates(body)
            if events is None:
                data = b"[" + body
                raise UserError(f"malformed JSON ({_located(exc, data)}){_nan_hint(exc, data)}", self.path) from None
            return events
        except RecursionError:
            raise UserError(f"an event is nested too deeply (over {_depth_limit()} levels)", self.path) from None

    def _without_lone_surrogates(self, body: bytes) -> list | None:
        """The events of a run that failed to decode only because a string holds a lone UTF-16 surrogate escape
        (`"\\ud800"`: valid JSON, no Unicode character; Python's json reads it, msgspec does not), with each
        such escape read as U+FFFD and a note; None when the run has none or still does not decode."""
        fixed, n = _LONE_SURROGATE.subn(rb"\1\\ufffd", body)
        if not n:
            return None
        try:
            events = self.decoder.decode(b"[" + fixed + b"]")
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            return None
        self.lone_surrogates += n
        return events

    def _read_metadata(self, header: bytes, trailer: bytes) -> None:
        if self.bare_list:
            return
        if _KEY.search(trailer) or len(_KEY.findall(header)) > 1:
            self.notes.append("the trace has a second traceEvents key: only the first event array was read")
        try:
            meta = self._decode_metadata(header + b"[]" + trailer)
        except msgspec.DecodeError as exc:
            data = header + b"[]" + trailer
            hint = _nan_hint(exc, data)
            raise UserError(f"malformed JSON around the event array ({_located(exc, data)}){hint}", self.path) from None
        except RecursionError:
            raise UserError(f"metadata nested too deeply (over {_depth_limit()} levels)", self.path) from None
        if isinstance(meta, dict):
            meta.pop("traceEvents", None)
            self.metadata = meta

    def _decode_metadata(self, data: bytes) -> Any:
        """The document around the event array; a lone surrogate escape in it is read as U+FFFD, as in events."""
        try:
            return msgspec.json.decode(data)
        except msgspec.DecodeError:
            fixed, n = _LONE_SURROGATE.subn(rb"\1\\ufffd", data)
            if not n:
                raise
            meta = msgspec.json.decode(fixed)  # still malformed: the caller reports the first error
            self.lone_surrogates += n
            return meta

    def _raise_not_trace(self, header: bytes) -> None:
        try:
            doc = msgspec.json.decode(header)
        except (msgspec.DecodeError, RecursionError):
            if encoding := _wide_encoding(header):
                raise UserError(f"not a trace: the file is {encoding} text; save it as UTF-8", self.path) from None
            raise UserError("not a trace: malformed or truncated JSON with no traceEvents array", self.path) from None
        kind = type(doc).__name__
        raise UserError(f"not a trace: a JSON {kind} without a traceEvents array", self.path)


_BYTE = re.compile(r"\(byte (\d+)\)")


def _located(exc: Exception, data: bytes) -> str:
    """The decoder's message with its '(byte N)', an offset into the run of events decoded (not into the file:
    a 13 MB file's error said 'byte 456245'), replaced by the text there: `near '"ts": 9x0000, "dur": 1'`."""
    m = _BYTE.search(str(exc))
    if m is None:
        return str(exc)
    at = int(m.group(1))
    text = data[max(0, at - 12) : at + 20].decode("utf-8", "replace")
    near = " ".join(text.split())
    return str(exc)[: m.start()] + f"near {near!r}" + str(exc)[m.end() :]


def _nan_hint(exc: Exception, data: bytes) -> str:
    """What a decode error at NaN / Infinity means: JSON has no such numbers, and Python's json.dump writes them
    (a trace edited by a script); the decoder only says 'invalid character (byte N)'."""
    m = _BYTE.search(str(exc))
    at = data[int(m.group(1)) : int(m.group(1)) + 9] if m else b""
    if m and at.startswith(b"Infinity") and data[int(m.group(1)) - 1 : int(m.group(1))] == b"-":
        at = b"-" + at  # the decoder points past the sign
    if at.startswith((b"NaN", b"Infinity", b"-Infinity")):
        word = at.split(b",")[0].split(b"}")[0].decode("ascii", "replace")
        return f": {word} is not a JSON number (Python's json.dump writes it); write null there, or a number"
    return ""


def _wide_encoding(head: bytes) -> str | None:
    """'UTF-16' / 'UTF-32' for text in those encodings (by their byte-order mark or their NUL bytes), else None."""
    if head.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "UTF-32"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "UTF-16"
    sample = head[:64]
    text = sample.replace(b"\x00", b"")
    if (
        len(sample) >= 8
        and sample.count(0) >= len(sample) // 2 - 1
        and text.isascii()
        and text.lstrip()[:1] in (b"{", b"[")
    ):
        return "UTF-32" if sample.count(0) >= 3 * len(sample) // 4 - 1 else "UTF-16"
    return None


def _depth_limit() -> int:
    """About how deep the decoder can nest (it recurses in C, bounded by the interpreter's recursion limit)."""
    return sys.getrecursionlimit()
