"""Every bad input: one line naming the file and the problem, exit code 2, no traceback."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest
from builders import kernel, run_cli, write_trace

GEMM = "volta_sgemm_128x64_nn"
NCCL = "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)"


def assert_clean_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.startswith("overlapcheck: error:")]
    assert errors, proc.stderr
    for needle in needles:
        assert any(needle in line for line in errors), (needle, proc.stderr)


def good_trace(folder: Path, rank: int) -> Path:
    return write_trace(folder, f"rank{rank}.json.gz", [kernel(GEMM, 0, 10), kernel(NCCL, 5, 10, stream=20)], rank=rank)


@pytest.mark.parametrize(
    "name,content,message",
    [
        ("rank0.json", b"", "empty file"),
        ("rank0.json.gz", gzip.compress(b'{"traceEvents": [{"ph": "X"}]}', mtime=0)[:-12], "truncated gzip"),
        ("rank0.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "a", "ts": 1, "du', "truncated JSON"),
        ("rank0.json", b'{"traceEvents": [{"ph": "X", "ts": 1}, {"ph": ', "truncated JSON"),
        ("rank0.json", b'{"hello": "world", "list": [1, 2]}', "not a trace"),
        ("rank0.json", b"42", "not a trace"),
        ("rank0.json", b"this is not json at all", "not a trace"),
        ("rank0.json", b'{"traceEvents": [{"ph": "X", "ts": "soon"}]}', "unexpected event field"),
        ("rank0.json", b"\xff\xfe\x00garbage", "not a trace"),
    ],
)
def test_unreadable_trace(tmp_path, name, content, message):
    path = tmp_path / name
    path.write_bytes(content)
    proc = run_cli("analyze", str(path))
    assert_clean_error(proc, str(path), message)
    assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) == 1


def test_missing_path(tmp_path):
    assert_clean_error(run_cli("analyze", str(tmp_path / "nope")), "nope", "no such file")


def test_empty_folder(tmp_path):
    assert_clean_error(run_cli("analyze", str(tmp_path)), "no trace files")


def test_bad_file_among_good_ones_still_reports_the_others(tmp_path):
    good_trace(tmp_path, 0)
    good_trace(tmp_path, 1)
    (tmp_path / "rank2.json").write_text('{"traceEvents": [')
    proc = run_cli("analyze", str(tmp_path), "--format", "json")
    assert_clean_error(proc, "rank2.json", "truncated")
    report = json.loads(proc.stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert report["errors"][0]["source"].endswith("rank2.json")


def test_two_files_claiming_the_same_rank(tmp_path):
    good_trace(tmp_path, 0)
    write_trace(tmp_path, "other.json.gz", [kernel(GEMM, 0, 10)], rank=0)
    good_trace(tmp_path, 1)
    proc = run_cli("analyze", str(tmp_path), "--format", "json")
    assert_clean_error(proc, "rank 0 is claimed by several files", "other.json.gz")
    assert [r["rank"] for r in json.loads(proc.stdout)["ranks"]] == [1]


def test_rank_unknown_among_several_files(tmp_path):
    good_trace(tmp_path, 0)
    write_trace(tmp_path, "mystery.json.gz", [kernel(GEMM, 0, 10)], rank=None)
    assert_clean_error(run_cli("analyze", str(tmp_path)), "mystery.json.gz", "cannot tell the rank")


def test_ambiguous_rank_in_file_name(tmp_path):
    path = write_trace(tmp_path, "rank3_worker5.json.gz", [kernel(GEMM, 0, 10)], rank=None)
    assert_clean_error(run_cli("analyze", str(path)), "ambiguous rank")


def test_single_file_without_rank_is_assumed_rank_0(tmp_path):
    path = write_trace(tmp_path, "trace.json.gz", [kernel(GEMM, 0, 10)], rank=None)
    proc = run_cli("analyze", str(path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    rank = json.loads(proc.stdout)["ranks"][0]
    assert rank["rank"] == 0 and any("assumed 0" in n for n in rank["notes"])


def test_output_is_never_overwritten_without_force(tmp_path):
    trace = good_trace(tmp_path, 0)
    out = tmp_path / "report.json"
    out.write_text("precious")
    assert_clean_error(run_cli("analyze", str(trace), "--format", "json", "-o", str(out)), "already exists")
    assert out.read_text() == "precious"
    proc = run_cli("analyze", str(trace), "--format", "json", "-o", str(out), "--force")
    assert proc.returncode == 0
    assert json.loads(out.read_text())["schema"] == "overlapcheck.report/1"


def test_bad_ds_config(tmp_path):
    trace = good_trace(tmp_path, 0)
    cfg = tmp_path / "ds.json"
    cfg.write_text("{nope")
    assert_clean_error(run_cli("analyze", str(trace), "--ds-config", str(cfg)), "ds.json", "DeepSpeed config")


def test_a_file_named_twice_is_read_once(tmp_path):
    good_trace(tmp_path, 0)
    good_trace(tmp_path, 1)
    (tmp_path / "link.json.gz").symlink_to(tmp_path / "rank1.json.gz")
    proc = run_cli("analyze", str(tmp_path), str(tmp_path / "rank0.json.gz"), "--format", "json", "-o", "-")
    assert proc.returncode == 0, proc.stderr
    assert [r["rank"] for r in json.loads(proc.stdout)["ranks"]] == [0, 1]  # folder + a file in it + a link
    assert not (Path.cwd() / "-").exists()  # `-o -` is stdout, not a file named "-"


@pytest.mark.parametrize(
    ("args", "message", "help_of"),
    [
        (["analyze", "--bogus"], "No such option '--bogus'", "overlapcheck analyze --help"),
        (["--bogus"], "No such option '--bogus'", "overlapcheck --help"),
        (["analyze"], "Missing argument 'PATHS...'", "overlapcheck analyze --help"),
        (["analyze", ".", "--steps", "x"], "Invalid value for --steps", "overlapcheck analyze --help"),
        (["nosuch"], "No such command 'nosuch'", "overlapcheck --help"),
        (["baseline", "nosuch"], "No such command 'nosuch'", "overlapcheck baseline --help"),
    ],
)
def test_usage_errors_are_one_line_naming_the_help(args, message, help_of):
    proc = run_cli(*args)
    assert_clean_error(proc, message, f"(see '{help_of}')")
    assert proc.stdout == "" and proc.stderr.count("\n") == 1


def test_a_run_manifest_that_is_no_object_is_an_error_and_another_schema_a_note(tmp_path):
    good_trace(tmp_path, 0)
    (tmp_path / "run.json").write_text("[1, 2]")
    assert_clean_error(run_cli("analyze", str(tmp_path)), "a run manifest must be a JSON object")
    (tmp_path / "run.json").write_text(json.dumps({"schema": "other.run/9", "world_size": "two", "ranks": 5}))
    proc = run_cli("analyze", str(tmp_path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    notes = json.loads(proc.stdout)["notes"]
    assert any("run.json's schema is 'other.run/9', not 'overlapcheck.run/1'" in n for n in notes), notes


def test_run_json_and_traces_that_disagree_on_hosts_are_a_note(tmp_path):
    for rank, host in ((0, "node1.cluster"), (1, "node7")):
        events = [kernel(GEMM, 0, 10), kernel(NCCL, 5, 10, stream=20)]
        write_trace(tmp_path, f"rank{rank}.json.gz", events, rank=rank, host_name=host)
    ranks = [{"rank": 0, "host": "node1"}, {"rank": 1, "host": "node2"}]
    (tmp_path / "run.json").write_text(json.dumps({"schema": "overlapcheck.run/1", "ranks": ranks}))
    proc = run_cli("analyze", str(tmp_path), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    notes = json.loads(proc.stdout)["notes"]
    [note] = [n for n in notes if "disagree on hosts" in n]
    assert "rank 1: node2 in run.json, node7 in its trace" in note and "rank 0" not in note  # node1 is node1.cluster
