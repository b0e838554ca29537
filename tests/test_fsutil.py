"""fsutil: inputs are regular files read with bounds; outputs never clobber, never leave a temp file, and every
failure is one UserError line."""

from __future__ import annotations

import errno
import json
import multiprocessing as mp
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from overlapcheck import fsutil
from overlapcheck.errors import UserError


@pytest.fixture
def no_hang() -> Iterator[None]:
    """Fail (instead of hanging the suite) when a read blocks, e.g. on a FIFO."""

    def on_alarm(signum, frame):  # noqa: ANN001
        raise TimeoutError("blocked")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(10)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def one_line(exc: pytest.ExceptionInfo[UserError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


# ---- inputs ------------------------------------------------------------------------------------------


def test_open_input_refuses_a_fifo_without_opening_it(tmp_path, no_hang):
    fifo = tmp_path / "rank0.json"
    os.mkfifo(fifo)
    with pytest.raises(UserError) as exc:
        fsutil.open_input(fifo, "a trace file")
    assert "FIFO" in one_line(exc) and str(fifo) in str(exc.value)


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/null"])
def test_open_input_refuses_devices(device, no_hang):
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    with pytest.raises(UserError, match="character device"):
        fsutil.open_input(device, "a trace file")


def test_open_input_names_each_kind_of_missing_file(tmp_path):
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    cases = {
        tmp_path / "missing": "no such file",
        tmp_path / "broken": "broken symbolic link",
        tmp_path / "loop_a": "symbolic link loop",
        tmp_path: "is a directory",
        str(tmp_path / "nul\0byte"): "not a valid path",
    }
    for path, message in cases.items():
        with pytest.raises(UserError) as exc:
            fsutil.open_input(path, "a trace file")
        assert message in one_line(exc), (path, str(exc.value))


def test_open_input_reads_a_regular_file_and_a_link_to_one(tmp_path):
    target = tmp_path / "t.json"
    target.write_bytes(b"[1]")
    (tmp_path / "link.json").symlink_to(target)
    for path in (target, tmp_path / "link.json"):
        with fsutil.open_input(path, "x") as f:
            assert f.read() == b"[1]"


def test_file_size_never_fails(tmp_path):
    (tmp_path / "a").write_bytes(b"12345")
    (tmp_path / "broken").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "fifo")
    assert fsutil.file_size(tmp_path / "a") == 5
    assert fsutil.file_size(tmp_path / "broken") == 0
    assert fsutil.file_size(tmp_path / "fifo") == 0
    assert fsutil.file_size(tmp_path / "missing") == 0
    assert fsutil.file_size(tmp_path) == 0


def test_read_json_file(tmp_path, no_hang):
    good = tmp_path / "ds.json"
    good.write_text('{"zero_optimization": {"stage": 3}}')
    assert fsutil.read_json_file(good, "a DeepSpeed config") == {"zero_optimization": {"stage": 3}}
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    cases = {
        "empty.json": (b"", "empty file"),
        "blank.json": (b"  \n", "empty file"),
        "bad.json": (b"{nope", "invalid JSON"),
        "deep.json": (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        "latin1.json": (b'{"a": "\xe9"}', "not UTF-8"),
        "big.json": (b"[" + b"1," * 600 + b"1]", "larger than"),
    }
    for name, (content, message) in cases.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(UserError) as exc:
            fsutil.read_json_file(
                tmp_path / name, "a DeepSpeed config", max_bytes=1000 if name == "big.json" else 1 << 20
            )
        assert message in one_line(exc), (name, str(exc.value))
        assert "a DeepSpeed config" in str(exc.value)
    with pytest.raises(UserError, match="FIFO"):
        fsutil.read_json_file(fifo, "a report")
    with pytest.raises(UserError, match="character device"):
        fsutil.read_json_file("/dev/zero", "a DeepSpeed config")


def test_read_bytes_stops_at_the_bound(tmp_path):
    path = tmp_path / "x"
    path.write_bytes(b"a" * 101)
    assert fsutil.read_bytes(path, "x", max_bytes=101) == b"a" * 101
    with pytest.raises(UserError, match="larger than 100 bytes"):
        fsutil.read_bytes(path, "x", max_bytes=100)


# ---- outputs -----------------------------------------------------------------------------------------


def test_no_clobber_is_atomic_against_a_writer_that_comes_in_between(tmp_path, monkeypatch):
    """The other writer creates the file after our check and before our publish: we must fail, not replace."""
    target = tmp_path / "report.json"
    real_write = fsutil._write_all

    def racing_write(fd: int, data: bytes) -> None:
        if not target.exists():
            target.write_text("the other run's report")
        real_write(fd, data)

    monkeypatch.setattr(fsutil, "_write_all", racing_write)
    with pytest.raises(UserError, match="already exists"):
        fsutil.atomic_write(target, "ours")
    assert target.read_text() == "the other run's report"
    assert os.listdir(tmp_path) == ["report.json"]


def _write_once(path: str, text: str, results: mp.Queue) -> None:
    try:
        fsutil.atomic_write(path, text * 1000)
        results.put("ok")
    except UserError:
        results.put("refused")


def test_concurrent_writers_without_force_exactly_one_wins(tmp_path):
    ctx = mp.get_context("fork")
    for round_ in range(5):
        path = str(tmp_path / f"r{round_}.json")
        results: mp.Queue = ctx.Queue()
        procs = [ctx.Process(target=_write_once, args=(path, f"writer{i} ", results)) for i in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        outcomes = sorted(results.get(timeout=5) for _ in procs)
        assert outcomes == ["ok", "refused", "refused", "refused"]
        text = Path(path).read_text()
        assert len(set(text.split())) == 1  # one writer's whole file, never a mix
    assert sorted(os.listdir(tmp_path)) == [f"r{i}.json" for i in range(5)]


def test_without_hard_links_the_exclusive_create_still_refuses(tmp_path, monkeypatch):
    def no_link(src, dst):  # noqa: ANN001
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)
    target = tmp_path / "out.txt"
    fsutil.atomic_write(target, "first")
    assert target.read_text() == "first"
    with pytest.raises(UserError, match="already exists"):
        fsutil.atomic_write(target, "second")
    assert target.read_text() == "first" and os.listdir(tmp_path) == ["out.txt"]


def test_a_symlink_is_refused_without_force_and_written_through_with_it(tmp_path):
    real = tmp_path / "reports" / "a.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "latest.json"
    link.symlink_to(real)
    with pytest.raises(UserError, match="symbolic link"):
        fsutil.check_target(link)
    with pytest.raises(UserError, match="symbolic link"):
        fsutil.atomic_write(link, "new")
    assert real.read_text() == "old" and link.is_symlink()
    fsutil.atomic_write(link, "new", force=True)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new"
    assert sorted(os.listdir(real.parent)) == ["a.json"] and sorted(os.listdir(tmp_path)) == ["latest.json", "reports"]


@pytest.mark.parametrize("force", [False, True])
def test_dangling_links_directories_and_fifos_are_never_outputs(tmp_path, force, no_hang):
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "adir").mkdir()
    (tmp_path / "dirlink").symlink_to(tmp_path / "adir")
    os.mkfifo(tmp_path / "fifo")
    for name, message in {
        "dangling": "does not exist",
        "adir": "is a directory",
        "dirlink": "directory",
        "fifo": "FIFO",
    }.items():
        for call in (fsutil.check_target, fsutil.atomic_write):
            args = (tmp_path / name, "x", force) if call is fsutil.atomic_write else (tmp_path / name, force)
            with pytest.raises(UserError) as exc:
                call(*args)
            assert message in one_line(exc), (name, str(exc.value))
    assert not (tmp_path / "nowhere").exists()
    assert sorted(os.listdir(tmp_path)) == ["adir", "dangling", "dirlink", "fifo"]
    assert os.listdir(tmp_path / "adir") == []


def test_a_full_disk_is_one_line_and_leaves_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    target.write_text("old")

    def full(fd: int, data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fsutil, "_write_all", full)
    for force in (True, False):
        with pytest.raises(UserError) as exc:
            fsutil.atomic_write(target, "new", force=force)
        assert "No space left on device" in one_line(exc) or "already exists" in str(exc.value)
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["report.json"]
    with pytest.raises(UserError, match="No space left"):
        fsutil.atomic_write(tmp_path / "new.json", "new")
    assert os.listdir(tmp_path) == ["report.json"]


def test_a_failing_rename_is_a_user_error_and_leaves_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "a.json"
    target.write_text("old")

    def broken(src, dst):  # noqa: ANN001
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(UserError, match="Input/output error"):
        fsutil.atomic_write(target, "new", force=True)
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["a.json"]


def test_a_read_only_folder_is_a_user_error(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        with pytest.raises(UserError, match="cannot write"):
            fsutil.atomic_write(folder / "x.json", "x")
    finally:
        folder.chmod(0o700)


def test_written_files_get_the_umask_mode_and_whole_content(tmp_path):
    target = tmp_path / "r.json"
    fsutil.atomic_write(target, json.dumps({"a": 1}))
    assert json.loads(target.read_text()) == {"a": 1}
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask
    fsutil.atomic_write(target, b"bytes", force=True, durable=False)
    assert target.read_bytes() == b"bytes"


def test_a_replaced_file_keeps_its_permissions(tmp_path):
    # was: `--force` over a private 0600 report wrote it back 0644 (the umask's mode), readable by everyone
    target = tmp_path / "private.json"
    target.write_text("{}")
    target.chmod(0o600)
    fsutil.atomic_write(target, "new", force=True)
    assert target.read_text() == "new" and target.stat().st_mode & 0o777 == 0o600
