"""`overlapcheck run` says what happened: strict options, one owner per rank, partial windows, nothing captured,
Slurm without RANK, killed exports. Unit-level (no real DeepSpeed job; a few tiny torch loops in-process)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapcheck.capture import hook, launchers, layout, manifest, session
from overlapcheck.capture.atomic import atomic_write_json, read_json
from overlapcheck.capture.rank import RankCapture
from overlapcheck.capture.settings import CaptureSettings, Schedule
from overlapcheck.cli import main

TRACE_PATTERN = re.compile(r"\.json(\.gz)?$", re.IGNORECASE)  # what `report` / `analyze` read as a trace


def _run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", *args], env=env)
    assert "Traceback" not in result.output
    return result.exit_code, result.output


# ---- options -----------------------------------------------------------------------------------------


def test_a_mistyped_option_is_an_error_with_a_suggestion_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"
    code, output = _run(
        "--out", str(tmp_path / "r"), "--stpes", "1:2", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"
    )
    assert code == 2 and "No such option" in output and "--steps" in output
    assert not marker.exists() and not (tmp_path / "r").exists()


def test_the_command_must_follow_the_double_dash(tmp_path):
    code, output = _run("--out", str(tmp_path / "r"), sys.executable, "train.py")
    assert code == 2 and "put `--` before the command" in output and not (tmp_path / "r").exists()
    # `-c` is no option of ours: said as the missing `--`, not as click's "No such option"
    code, output = _run("--out", str(tmp_path / "r"), sys.executable, "-c", "pass")
    assert code == 2 and f"overlapcheck run --out {tmp_path / 'r'} -- {sys.executable} -c pass" in output
    assert "No such option" not in output and not (tmp_path / "r").exists()
    code, output = _run("deepspeed", "train.py", "--deepspeed", "ds.json")
    assert code == 2 and "overlapcheck run -- deepspeed train.py --deepspeed ds.json" in output
    code, output = _run("--out", str(tmp_path / "r"))
    assert code == 2 and "no command given" in output
    code, output = _run("--out", str(tmp_path / "r"), "--")
    assert code == 2 and "no command given" in output


def test_job_options_after_the_double_dash_are_the_jobs(tmp_path):
    out = tmp_path / "r"
    code, output = _run("--out", str(out), "--", sys.executable, "-c", "import sys; sys.exit(0)", "--steps", "x")
    assert code == 0, output
    assert read_json(str(out / "run.json"))["command"][-2:] == ["--steps", "x"]


def test_a_huge_rank_range_costs_nothing(tmp_path):
    code, output = _run("--out", str(tmp_path / "r"), "--ranks", "0-100000000000", "--", sys.executable, "-c", "pass")
    assert code == 0, output
    settings = CaptureSettings(str(tmp_path), Schedule(), ranks="0-100000000000,200000000000")
    assert settings.wants(99_999_999_999) and settings.wants(200_000_000_000) and not settings.wants(100_000_000_001)


# ---- nothing captured --------------------------------------------------------------------------------


def test_nothing_captured_says_why_and_keeps_the_exit_code(tmp_path):
    out = tmp_path / "r"
    code, output = _run("--out", str(out), "--", sys.executable, "-c", "import sys; sys.exit(3)")
    assert code == 3
    assert "0/0" not in output and "no rank traces" in output
    assert "exit code 3" in output and "optimizer step" in output
    notes = read_json(str(out / "run.json"))["notes"]
    assert any("exit code 3" in n for n in notes) and any("PYTHONPATH" in n for n in notes)


def test_nothing_captured_names_a_missing_torch(tmp_path, monkeypatch):
    real = session.importlib.util.find_spec
    monkeypatch.setattr(
        session.importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    notes = session.capture_notes({"ranks": []}, launchers.plan(["python", "t.py"], []), {}, 0)
    assert any("torch is not importable" in n and "overlapcheck[capture]" in n for n in notes)
    assert not any("exit code" in n for n in notes)


def test_a_manifest_that_cannot_be_written_does_not_change_the_exit_code(tmp_path, monkeypatch):
    real = manifest.merge

    def broken(out, own):  # noqa: ANN001
        if own.get("finished_at") is None:
            return real(out, own)  # before the job: fine
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(manifest, "merge", broken)
    code, output = _run("--out", str(tmp_path / "r"), "--", sys.executable, "-c", "import sys; sys.exit(5)")
    assert code == 5 and "could not write the run manifest" in output


# ---- Slurm -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv,env,hint",
    [
        (["srun", "-N", "2", "python", "train.py"], {}, True),
        (["srun", "--ntasks=8", "--export=ALL", "python", "train.py"], {}, True),
        (["srun", "-N", "2", "python", "train.py"], {"RANK": "0"}, False),
        (["srun", "-N", "2", "torchrun", "--nnodes", "2", "train.py"], {}, False),
        (["srun", "--nodes", "2", "deepspeed", "train.py"], {}, False),
        (["srun", "bash", "-c", "RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS python t.py"], {}, False),
        (["python", "train.py"], {"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, True),
        (["python", "train.py"], {"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}, False),
        (["python", "train.py"], {}, False),
    ],
)
def test_slurm_without_rank_variables_is_said(argv, env, hint):
    text = session.slurm_hint(launchers.plan(argv, ["OVERLAPCHECK_OUT"]), env)
    assert (text is not None) == hint
    if hint:
        assert "RANK" in text and "torchrun" in text and "docs/capture.md" in text


def test_srun_options_with_values_are_skipped_to_find_the_program():
    p = launchers.plan(["srun", "-N", "4", "--export=NONE", "-l", "python", "t.py", "--export=x"], ["A"])
    assert p.inner == "python" and p.argv[3] == "--export=A" and p.argv[-1] == "--export=x"
    p = launchers.plan(["srun", "--ntasks", "8", "--export", "B", "torchrun", "t.py"], ["A"])
    assert p.inner == "torchrun" and p.argv[4] == "B,A"


def test_run_prints_the_slurm_hint_before_the_job(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    srun = fake / "srun"
    srun.write_text('#!/bin/sh\nshift 2\nexec "$@"\n')  # `srun -N 1 PROGRAM...`: runs PROGRAM once
    srun.chmod(0o755)
    env = {"PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "RANK": None, "WORLD_SIZE": None}
    out = tmp_path / "r"
    code, output = _run("--out", str(out), "--", "srun", "-N", "1", sys.executable, "-c", "pass", env=env)
    assert code == 0 and "note: Slurm starts these tasks" in output
    assert any("SLURM_PROCID" in n for n in read_json(str(out / "run.json"))["notes"])


# ---- one owner per rank -------------------------------------------------------------------------------


def _cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wait: int = 100) -> RankCapture:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    return RankCapture(CaptureSettings(str(tmp_path), Schedule(wait=wait)))


def test_a_second_process_with_the_same_rank_captures_nothing(tmp_path, monkeypatch, capsys):
    owner = _cap(tmp_path, monkeypatch)
    owner.on_step("optimizer", object())
    status_before = (tmp_path / "status" / "rank0.json").read_bytes()
    helper = _cap(tmp_path, monkeypatch)
    helper.on_step("optimizer", object())
    helper.on_step("optimizer", object())
    assert helper.helper and helper.profiler is None
    assert "also steps an optimizer as rank 0" in capsys.readouterr().err
    assert (tmp_path / "status" / "rank0.json").read_bytes() == status_before
    helper.at_exit()
    assert (tmp_path / "status" / "rank0.json").read_bytes() == status_before
    assert read_json(layout.rank_owner_path(str(tmp_path), 0))["pid"] == os.getpid()


def test_the_process_that_joined_the_job_takes_the_rank_from_a_helper(tmp_path, monkeypatch):
    helper_pid = os.getppid()  # alive, not us
    os.makedirs(tmp_path / "status")
    atomic_write_json(
        layout.rank_owner_path(str(tmp_path), 0), {"pid": helper_pid, "host": socket.gethostname(), "joined": False}
    )
    os.makedirs(layout.traces_dir(str(tmp_path)))
    Path(layout.trace_path(str(tmp_path), 0)).write_bytes(b"the helper's")
    from overlapcheck.capture import rankinfo

    real = rankinfo.identity
    monkeypatch.setattr(rankinfo, "identity", lambda: {**real(), "backend": "gloo"})
    cap = _cap(tmp_path, monkeypatch)
    cap.on_step("deepspeed", object())
    assert not cap.helper and cap.profiler is not None
    assert read_json(layout.rank_owner_path(str(tmp_path), 0))["pid"] == os.getpid()
    assert not os.path.exists(layout.trace_path(str(tmp_path), 0))


def test_a_dead_owner_on_this_host_is_replaced(tmp_path, monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    os.makedirs(tmp_path / "status")
    owner = {"pid": dead.pid, "host": socket.gethostname(), "joined": True}
    atomic_write_json(layout.rank_owner_path(str(tmp_path), 0), owner)
    cap = _cap(tmp_path, monkeypatch)
    cap.on_step("optimizer", object())
    assert not cap.helper and read_json(layout.rank_status_path(str(tmp_path), 0))["pid"] == os.getpid()


def test_an_owner_that_lost_its_claim_stops_writing(tmp_path, monkeypatch):
    cap = _cap(tmp_path, monkeypatch)
    cap.on_step("optimizer", object())
    claim = layout.rank_owner_path(str(tmp_path), 0)
    atomic_write_json(claim, {"pid": os.getppid(), "host": socket.gethostname(), "joined": True})
    status = layout.rank_status_path(str(tmp_path), 0)
    before = Path(status).read_bytes()
    cap.write_status()
    assert cap.helper and cap.profiler is None and Path(status).read_bytes() == before


def test_a_forked_copy_of_the_controller_does_nothing(tmp_path, monkeypatch):
    cap = _cap(tmp_path, monkeypatch, wait=1)
    cap.pid = -1  # as seen from a forked child
    cap.on_step("optimizer", object())
    cap.at_exit()
    assert cap.profiler is None and not (tmp_path / "status" / "rank0.json").exists()
    hook._controller = object()
    hook._forget_controller()
    assert hook._controller is None


# ---- partial windows ---------------------------------------------------------------------------------


def _train(cap: RankCapture, steps: int) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        cap.on_step("optimizer", opt)


def test_a_job_that_ends_inside_the_window_keeps_a_partial_trace_marked_incomplete(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(RankCapture, "_start_summary", lambda self: None)
    cap = _cap(tmp_path, monkeypatch)
    cap.settings = CaptureSettings(str(tmp_path), Schedule(wait=2, warmup=1, active=3))  # records steps 3-5
    _train(cap, 5)  # steps 0-4: the job ends after step 4
    cap.at_exit()
    status = read_json(layout.rank_status_path(str(tmp_path), 0))
    capture = status["capture"]
    assert capture["status"] == "failed" and capture["complete"] is False
    assert capture["steps_captured"] == {"first": 3, "last": 4}
    assert "steps 3-4 of 3-5 recorded" in capture["error"]
    assert os.path.isfile(layout.trace_path(str(tmp_path), 0))
    launcher = {"node_rank": 0, "finished_at": "t", "exit_code": 0, "command": ["python"], "kind": "python"}
    doc = manifest.merge(str(tmp_path), launcher)
    assert doc["incomplete_ranks"] == [0] and doc["ranks"][0]["capture"]["steps_captured"] == {"first": 3, "last": 4}
    notes = session.capture_notes(doc, launchers.plan(["python", "t.py"], []), {}, 0)
    assert any("capture incomplete on 1 of 1 ranks" in n and "3-4 of 3-5" in n for n in notes)


def test_a_job_that_ends_in_the_warm_up_has_no_step(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(RankCapture, "_start_summary", lambda self: None)
    cap = _cap(tmp_path, monkeypatch)
    cap.settings = CaptureSettings(str(tmp_path), Schedule(wait=2, warmup=2, active=1))  # records step 4
    _train(cap, 3)
    cap.at_exit()
    capture = read_json(layout.rank_status_path(str(tmp_path), 0))["capture"]
    assert capture["status"] == "failed" and capture["steps_captured"] is None and capture["complete"] is False
    assert "no step of 4-4 recorded" in capture["error"]


def test_a_whole_window_is_complete(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(RankCapture, "_start_summary", lambda self: None)
    cap = _cap(tmp_path, monkeypatch)
    cap.settings = CaptureSettings(str(tmp_path), Schedule(wait=1, warmup=1, active=2))
    _train(cap, 5)
    cap.at_exit()
    capture = read_json(layout.rank_status_path(str(tmp_path), 0))["capture"]
    assert capture["status"] == "ok" and capture["complete"] is True
    assert capture["steps_captured"] == {"first": 2, "last": 3}
    doc = manifest.merge(str(tmp_path), {"node_rank": 0, "finished_at": "t", "exit_code": 0})
    assert doc["incomplete_ranks"] == [] and doc["ranks"][0]["capture"]["complete"] is True


# ---- killed exports ----------------------------------------------------------------------------------


def test_export_temp_files_never_look_like_traces_and_stale_ones_are_removed(tmp_path):
    host = socket.gethostname()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = layout.trace_tmp_path(str(tmp_path), 0, host, dead.pid)
    live = layout.trace_tmp_path(str(tmp_path), 1, host, os.getpid())
    other = layout.trace_tmp_path(str(tmp_path), 2, "another-host.example", dead.pid)
    os.makedirs(layout.traces_dir(str(tmp_path)))
    for path in (stale, live, other):
        Path(path).write_bytes(b"partial")
        name = os.path.basename(path)
        assert not TRACE_PATTERN.search(name) and layout.is_run_file(name) and layout.TRACE_TMP.match(name)
    assert session.remove_stale_exports(str(tmp_path)) == [os.path.basename(stale)]
    assert sorted(os.listdir(layout.traces_dir(str(tmp_path)))) == sorted(os.path.basename(p) for p in (live, other))


def test_run_json_documents_the_new_fields(tmp_path):
    """The keys `report` reads to say a capture is incomplete (docs/capture.md)."""
    docs = (Path(__file__).resolve().parents[1] / "docs" / "capture.md").read_text()
    for key in ("steps_captured", "complete", "incomplete_ranks", "`notes`"):
        assert key in docs
    json.dumps(manifest.merge(str(tmp_path), {"node_rank": 0, "finished_at": None}))
