"""Safe file input and output.

Input: only regular files are read (a FIFO, a device or a socket named like a trace would block or never end),
found without opening them, and small JSON documents are read with a size bound.
Output: never overwrite without consent (atomically: the no-clobber check is the link that publishes the file,
not a check before it), never leave a half-written or temp file behind, and every OS error is one UserError line.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import signal
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

from overlapcheck.errors import UserError

MAX_JSON_BYTES = 256 << 20  # run.json, a ds_config, a report, a summary: far below this
# a hard link is how a file appears without replacing one; where the file system has none, create-exclusive
_NO_LINK = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK, errno.ENOSYS, errno.EXDEV, errno.EACCES}


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _input_error(path: str, exc: OSError | ValueError, expected: str) -> UserError:
    """A UserError for a failed stat or open of an input path."""
    if isinstance(exc, ValueError):  # e.g. an embedded NUL byte
        return UserError(f"not a valid path ({exc})", path)
    if isinstance(exc, FileNotFoundError):
        if os.path.islink(path):
            return UserError("broken symbolic link: the file it points to does not exist", path)
        return UserError("no such file", path)
    if exc.errno == errno.ELOOP:
        return UserError("symbolic link loop", path)
    if isinstance(exc, IsADirectoryError):
        return UserError(f"is a directory, not {expected}", path)
    return UserError(f"cannot read: {exc.strerror or exc}", path)


def open_input(path: str | os.PathLike[str], expected: str) -> BinaryIO:
    """Open a user-given input file for binary reading; a missing, broken-link, directory, FIFO, device or
    unreadable path is a UserError (`expected` names what the path should have been, e.g. "a trace file").

    Non-regular files are refused from `os.stat` (never opened: opening a FIFO blocks until a writer comes),
    and the file is then opened non-blocking and checked again, so a path swapped in between cannot hang us."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except (OSError, ValueError) as exc:
        raise _input_error(path, exc, expected) from None
    if not stat.S_ISREG(st.st_mode):
        if stat.S_ISDIR(st.st_mode):
            raise UserError(f"is a directory, not {expected}", path)
        raise UserError(f"is {_kind(st.st_mode)}, not {expected}: only regular files are read", path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as exc:
        raise _input_error(path, exc, expected) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"is {_kind(st.st_mode)}, not {expected}: only regular files are read", path)
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def not_a_file(path: str | os.PathLike[str]) -> str | None:
    """What `path` is, in words, when it exists and is no regular file (a FIFO, a directory, a device, a broken
    link or a link loop); None when it is one or does not exist. Never opens it (a FIFO would block)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "a broken symbolic link" if os.path.islink(path) else None
    except (OSError, ValueError):
        return "a symbolic link loop" if os.path.islink(path) else None  # reading it says what is wrong
    return None if stat.S_ISREG(st.st_mode) else _kind(st.st_mode)


def file_size(path: str | os.PathLike[str]) -> int:
    """The size of a regular file, 0 for anything else or anything that cannot be stat'ed (a broken link, a
    file deleted meanwhile): for progress totals, which must never fail. The reader reports the real problem."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def read_bytes(path: str | os.PathLike[str], what: str, max_bytes: int = MAX_JSON_BYTES) -> bytes:
    """The whole content of a small regular file, at most `max_bytes` (UserError beyond, without reading more)."""
    with open_input(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > max_bytes:  # refused before reading a byte: a 900 MB document would take gigabytes to parse
            raise UserError(
                f"{_size_text(size)}, larger than {_size_text(max_bytes)}: too big for {what}", os.fspath(path)
            )
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise UserError(f"cannot read: {exc.strerror or exc}", os.fspath(path)) from None
    if len(data) > max_bytes:
        raise UserError(f"larger than {_size_text(max_bytes)}: too big for {what}", os.fspath(path))
    return data


def read_json_file(path: str | os.PathLike[str], what: str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read a small JSON document (run.json, a ds_config, a report, a summary) safely: regular files only,
    at most `max_bytes`, and any way it can fail (not UTF-8, not JSON, nested too deeply, out of memory)
    is one UserError line naming the file and `what` it should be (e.g. "a DeepSpeed config")."""
    return json_document(read_bytes(path, what, max_bytes), path, what)


def json_document(data: bytes, path: str | os.PathLike[str], what: str) -> Any:
    """`data`, the bytes of the file `path`, as JSON: any way it can fail is one UserError (see read_json_file)."""
    path = os.fspath(path)
    if not data.strip():
        raise UserError(f"empty file, not {what}", path)
    try:
        return json.loads(data)
    except RecursionError:
        raise UserError(f"not {what}: JSON nested too deeply", path) from None
    except UnicodeDecodeError as exc:
        raise UserError(f"not {what}: not UTF-8 text ({exc.reason} at byte {exc.start})", path) from None
    except ValueError as exc:
        raise UserError(f"not {what}: invalid JSON ({exc})", path) from None
    except MemoryError:
        raise UserError(f"out of memory while reading {what}", path) from None


def _size_text(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


_STREAM = re.compile(r"^/(?:dev/(?:stdin|stdout|stderr|fd/[0-9]+)|proc/(?:self|thread-self|[0-9]+)/fd/[0-9]+)$")


def _is_stream(path: str) -> bool:
    """Whether `path` names one of this process's open files (/dev/stdout, /dev/fd/N, /proc/self/fd/N), here or
    along its symbolic links: replacing the file behind it (`-o /dev/stdout >> log`) would erase what it held."""
    hop = os.path.abspath(path)
    for _ in range(40):
        if _STREAM.match(hop):
            return True
        if not os.path.islink(hop):
            return False
        try:
            hop = os.path.normpath(os.path.join(os.path.dirname(hop), os.readlink(hop)))
        except OSError:
            return False
    return False


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether `a` and `b` name one file or folder (also through a link or another spelling); False where
    either is missing or unreadable."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def is_nowhere(path: str | os.PathLike[str]) -> bool:
    """Whether `path` is the null device: an output written there is discarded (nothing to replace)."""
    try:
        return os.path.realpath(path) == os.devnull and not os.path.isfile(path)
    except (OSError, ValueError):
        return False


def _output_target(path: str, force: bool) -> str:
    """The file that writing `path` replaces or creates: `path` itself, or, for a symbolic link and `force`,
    the file it points to (the link is kept). UserError for anything that may not be written."""
    if _is_stream(path):
        raise UserError(
            "is a stream of this process, not a file path; to write the standard output give `-o -` "
            "(where the command has it), or a file path",
            path,
        )
    if os.path.islink(path):
        target = os.path.realpath(path)
        try:
            st: os.stat_result | None = os.stat(path)
        except OSError:
            st = None
        if st is None:
            raise UserError(
                "is a symbolic link to a file that does not exist (or a link loop); remove it or choose another path",
                path,
            )
        if stat.S_ISDIR(st.st_mode):
            raise UserError("is a symbolic link to a directory, not a file path", path)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"is a symbolic link to {_kind(st.st_mode)}; choose a file path", path)
        if not force:
            raise UserError(f"already exists (a symbolic link to {target}); pass --force to overwrite that file", path)
        return target
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot write: {getattr(exc, 'strerror', None) or exc}", path) from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UserError("is a directory, not a file path", path)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"is {_kind(st.st_mode)}; choose a file path", path)
        if not force:
            raise UserError("already exists; pass --force to overwrite it", path)
    return path


# what --force never replaces: the job's own documents, by name, and profiler traces, by what they hold
PROTECTED_NAMES = ("ds_config.json", "run.json", "truth.json", "model.json", ".summary.json")
_KINETO_MARKS = (b'"schemaVersion"', b'"distributedInfo"', b'"deviceProperties"', b'"traceName"')
_TRACE_MARKS = (b'"traceEvents"', b'"ph"')  # any Chrome trace: torch 1.8's bare event list, metadata-first ones

# the first bytes of what overlapcheck writes as JSON: a report, a comparison, a Perfetto export (metadata first)
_OWN_HEAD = re.compile(
    rb'^\s*\{\s*"(?:schema"\s*:\s*"overlapcheck\.|metadata"\s*:\s*\{\s*"generator"\s*:\s*"overlapcheck )'
)


def is_own_json(head: bytes) -> bool:
    """Whether the first bytes of a JSON document are those of one of overlapcheck's own outputs."""
    return _OWN_HEAD.match(head) is not None


def _never_replaced(target: str, path: str) -> None:
    """UserError when the existing file `target` is an input of some job, which no output replaces even with
    --force: a ds_config, run manifest, truth or model document, a per-rank summary, or a Kineto trace (a
    gzip or JSON file whose first 64 KiB carry Kineto's keys). An output of overlapcheck is none of these."""
    name = os.path.basename(target)
    if name in PROTECTED_NAMES or name.endswith(PROTECTED_NAMES[-1]):
        raise UserError(f"is a job's {name} (an input of overlapcheck), never replaced, even with --force", path)
    folder = os.path.dirname(os.path.abspath(target))  # RUN_DIR/status/ of `overlapcheck run` (capture/layout.py)
    if os.path.basename(folder) == "status" and os.path.isfile(os.path.join(os.path.dirname(folder), "run.json")):
        raise UserError(
            "is a run folder's status record (what its run.json is made of), never replaced, even with --force", path
        )
    try:
        with open(target, "rb") as fh:
            head = fh.read(1 << 16)
        if head[:2] == b"\x1f\x8b":
            import zlib

            with contextlib.suppress(zlib.error):
                head = _gunzip_head(head)
    except OSError:
        return
    if is_own_json(head):
        return  # a report, comparison or Perfetto file of an earlier run: what --force is for
    head = _utf8_head(head)
    json_like = head.lstrip()[:1] in (b"{", b"[")
    bare_events = re.match(rb"\s*\[\s*\{", head) is not None  # torch 1.8's event list: no report starts so
    if (
        any(mark in head for mark in _KINETO_MARKS)
        or (json_like and any(m in head for m in _TRACE_MARKS))
        or bare_events
    ):
        raise UserError("is a profiler trace (an input of overlapcheck), never replaced, even with --force", path)


def _utf8_head(head: bytes) -> bytes:
    """The first bytes of a document as UTF-8 without a byte order mark (the trace reader accepts UTF-8 with a
    BOM and UTF-16), so that a trace saved by an editor is recognized as one."""
    if head.startswith(b"\xef\xbb\xbf"):
        return head[3:]
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return head.decode("utf-16", "ignore").encode("utf-8", "ignore")
    return head


def _gunzip_head(data: bytes) -> bytes:
    """The first bytes a gzip prefix decompresses to (a truncated stream is fine)."""
    import zlib

    return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data, 1 << 16)


def check_target(path: str | os.PathLike[str], force: bool = False) -> None:
    """Raise UserError unless `path` may be written as a report: it must not exist (or `force`), must not be a
    directory, a FIFO, a device or a dangling symbolic link, and its folder must exist; and even with `force`
    it (or the file a symbolic link at it points to) is no job's input (`_never_replaced`). (Checked again,
    atomically, by `atomic_write`: this check only fails early, before a long analysis.)"""
    path = os.fspath(path)
    if is_nowhere(path):
        return
    target = _output_target(path, force)
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise UserError("its folder does not exist", path)
    if os.path.exists(target):
        _never_replaced(target, path)


class _Signalled(BaseException):
    """A terminating signal arrived while a temp file existed (see `_unwind_on_signals`)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _unwind_on_signals() -> Iterator[None]:
    """While a temp file exists, SIGTERM (what a CI timeout sends) and SIGHUP unwind the write, so that the temp
    file is removed, and are then delivered again as they came: the process still dies of that signal, with the
    status it would have had. Only a signal left at its default (kill) is taken, and only in the main thread
    (the only one that may set a handler): a handler the program set is kept."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def unwind(signum: int, frame: object) -> None:
        raise _Signalled(signum)

    taken = {}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        if sig is not None and signal.getsignal(sig) is signal.SIG_DFL:
            taken[sig] = signal.signal(sig, unwind)
    try:
        yield
    except _Signalled as exc:
        for sig, old in taken.items():
            signal.signal(sig, old)
        taken = {}
        os.kill(os.getpid(), exc.signum)
        raise SystemExit(128 + exc.signum) from None  # where the signal does not end the process at once
    finally:
        for sig, old in taken.items():
            signal.signal(sig, old)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def atomic_write(
    path: str | os.PathLike[str], data: str | bytes | Iterable[str], force: bool = False, durable: bool = True
) -> None:
    """Write `data` to `path` through a temp file in the same folder, so that readers see either the old file or
    the whole new one, and no temp file is left behind whatever happens (a full disk, a signal).

    Without `force` the file must not exist, and this holds atomically: the temp file is published with a hard
    link, which fails if another writer created `path` meanwhile (two runs writing the same `-o`: one of them
    gets the error); where the file system has no hard links, with an exclusive create. With `force` it is
    renamed over the old file. A symbolic link is never replaced: without `force` it is refused, with `force`
    the file it points to is replaced (atomically, in that file's folder) and the link kept.

    Every failure (the path exists, is a directory, its folder cannot be written, the disk is full) is a
    UserError naming `path`. `durable` fsyncs before publishing (reports); capture's own status files skip it
    (a sync per file costs the training step ~100 ms on a busy disk, and they are rewritten anyway). `data` may
    be pieces of text (a streamed report), written as they come.
    """
    path = os.fspath(path)
    if is_nowhere(path):
        return  # discarded (a streamed report is not even rendered)
    target = _output_target(path, force)
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise UserError("its folder does not exist", path)
    raw = data.encode("utf-8") if isinstance(data, str) else data if isinstance(data, bytes) else None
    pieces: Iterable[str | bytes] = [raw] if raw is not None else data  # type: ignore[assignment]
    with _unwind_on_signals():
        _write_through_temp(path, target, folder, raw, pieces, force, durable)


def _write_through_temp(
    path: str, target: str, folder: str, raw: bytes | None, pieces: Iterable[str | bytes], force: bool, durable: bool
) -> None:
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{_short(os.path.basename(target))}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise UserError(f"cannot write: {exc.strerror or exc}", path) from None
    try:
        try:
            for piece in pieces:
                _write_all(fd, piece if isinstance(piece, bytes) else piece.encode("utf-8"))
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, _mode_for(target))
        if force:
            os.replace(tmp, target)
        else:
            _publish_new(tmp, target, raw, durable)
    except FileExistsError:
        raise UserError("already exists; pass --force to overwrite it", path) from None
    except IsADirectoryError:
        raise UserError("is a directory, not a file path", path) from None
    except OSError as exc:
        raise UserError(f"cannot write: {exc.strerror or exc}", path) from None
    finally:
        with contextlib.suppress(OSError):  # gone when renamed into place
            os.unlink(tmp)


def _mode_for(target: str) -> int:
    """The permissions of a written file: those of the file it replaces (a private 0600 report stays private),
    else what a new file gets under the umask."""
    try:
        return stat.S_IMODE(os.stat(target).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _short(name: str, most: int = 80) -> str:
    """`name` cut to `most` bytes of UTF-8, for a temp file's name: a 255-byte output name with the temp name's
    prefix and suffix added was longer than a file name may be, and the write failed."""
    return name.encode("utf-8", "surrogateescape")[:most].decode("utf-8", "ignore")


def _publish_new(tmp: str, target: str, raw: bytes | None, durable: bool) -> None:
    """Make the complete temp file appear as `target`, failing with FileExistsError if `target` exists."""
    try:
        os.link(tmp, target)
        return
    except OSError as exc:
        if isinstance(exc, FileExistsError) or exc.errno not in _NO_LINK:
            raise
    # no hard links here: create-exclusive, then write (a reader may see it grow, but nothing is replaced)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        if raw is None:  # written as a stream: copy the temp file
            with open(tmp, "rb") as src:
                while chunk := src.read(1 << 20):
                    _write_all(fd, chunk)
        else:
            _write_all(fd, raw)
        if durable:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(target)
        raise
    os.close(fd)
