"""Unit tests for `overlapcheck run`'s launcher side: options, command parsing, env propagation, atomic
writes, the run folder and the run.json merge. No job is launched here."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from overlapcheck.capture import launchers, layout, manifest, propagation, session
from overlapcheck.capture.atomic import atomic_write_bytes, atomic_write_json, read_json
from overlapcheck.capture.settings import CaptureSettings, Schedule, parse_ranks
from overlapcheck.cli import main
from overlapcheck.errors import UserError

FORWARD = ["OVERLAPCHECK_OUT", "OVERLAPCHECK_SCHEDULE", "PYTHONPATH"]


# ---- settings ----------------------------------------------------------------------------------------


def test_schedule_window_and_steps_spec():
    s = Schedule(wait=5, warmup=2, active=3)
    assert (s.first, s.last) == (7, 9)
    assert Schedule.from_steps("10:12") == Schedule(wait=9, warmup=1, active=3)
    assert Schedule.from_steps("1:1") == Schedule(wait=1, warmup=0, active=1)
    assert Schedule.decode(s.encode()) == s


@pytest.mark.parametrize("spec", ["0:3", "5:4", "x", "3"])
def test_bad_steps_spec(spec):
    with pytest.raises(UserError):
        Schedule.from_steps(spec)


def test_wait_must_skip_the_first_step():
    with pytest.raises(UserError):
        Schedule(wait=0)


def test_rank_spec():
    assert parse_ranks("all") is None
    spec = parse_ranks("0,2,5-7")
    assert [r for r in range(10) if r in spec] == [0, 2, 5, 6, 7]
    huge = parse_ranks("0-100000000000,7")  # ranges, not a set: no memory for a huge range
    assert huge.ranges == ((0, 100000000000),) and 99999999999 in huge and 100000000001 not in huge
    for bad in ("1-", "a", "3-1"):
        with pytest.raises(UserError):
            parse_ranks(bad)
    settings = CaptureSettings("/x", Schedule(), ranks="1,3")
    assert [r for r in range(5) if settings.wants(r)] == [1, 3]


def test_settings_round_trip_through_env(tmp_path):
    settings = CaptureSettings(str(tmp_path), Schedule(3, 1, 2), with_stack=True, ranks="0-3")
    back = CaptureSettings.from_env(settings.to_env())
    assert back == settings
    assert CaptureSettings.from_env({}) is None
    assert CaptureSettings.from_env({**settings.to_env(), "OVERLAPCHECK_DISABLE": "1"}) is None


# ---- launcher detection ------------------------------------------------------------------------------


def test_deepspeed_single_node():
    p = launchers.plan(["deepspeed", "--num_gpus", "8", "train.py", "--node_rank", "5"], FORWARD)
    assert (p.kind, p.per_node, p.node_rank) == ("deepspeed", False, 0)  # script args are not the runner's


def test_deepspeed_per_node_no_ssh(tmp_path):
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    argv = [
        "deepspeed",
        f"--hostfile={hostfile}",
        "--no_ssh",
        "--node_rank",
        "1",
        "--master_addr",
        "127.0.0.1",
        "train.py",
    ]
    p = launchers.plan(argv, FORWARD)
    assert (p.kind, p.per_node, p.node_rank, p.hostfile) == ("deepspeed", True, 1, str(hostfile))
    assert p.argv == argv


def test_python_module_forms():
    ds = launchers.plan(
        [sys.executable, "-u", "-m", "deepspeed.launcher.runner", "--no_ssh", "--node_rank=2", "t.py"], FORWARD
    )
    assert (ds.kind, ds.node_rank) == ("deepspeed", 2)
    tr = launchers.plan(
        ["python3", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "1", "t.py"], FORWARD
    )
    assert (tr.kind, tr.per_node, tr.node_rank) == ("torchrun", True, 1)
    assert launchers.plan(["python", "train.py"], FORWARD).kind == "python"
    assert launchers.plan(["accelerate", "launch", "t.py"], FORWARD).kind == "other"


def test_torchrun_elastic_multi_node_needs_a_node_id(monkeypatch):
    for name in ("NODE_RANK", "SLURM_NODEID", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    argv = ["torchrun", "--nnodes", "2", "--rdzv-endpoint", "h:29400", "t.py"]
    with pytest.raises(UserError, match="--node_rank"):
        launchers.plan(argv, FORWARD)
    monkeypatch.setenv("SLURM_NODEID", "3")
    assert launchers.plan(argv, FORWARD).node_rank == 3


def test_torchrun_single_node_is_not_per_node():
    p = launchers.plan(["torchrun", "--nproc_per_node", "2", "--nnodes=1:1", "t.py"], FORWARD)
    assert (p.kind, p.per_node) == ("torchrun", False)


def test_srun_export_rewriting():
    assert launchers.plan(["srun", "-N", "2", "python", "t.py"], FORWARD).argv == ["srun", "-N", "2", "python", "t.py"]
    assert launchers.plan(["srun", "--export=ALL,FOO=1", "t"], FORWARD).argv[1] == "--export=ALL,FOO=1"
    assert launchers.plan(["srun", "--export=FOO", "t"], FORWARD).argv[1] == "--export=FOO," + ",".join(FORWARD)
    assert launchers.plan(["srun", "--export", "NONE", "t"], FORWARD).argv[2] == ",".join(FORWARD)
    # an --export of the program srun runs is not srun's
    assert launchers.plan(["srun", "prog", "--export=X"], FORWARD).argv[2] == "--export=X"


def test_empty_command_is_a_user_error():
    with pytest.raises(UserError):
        launchers.plan([], FORWARD)


# ---- environment propagation -------------------------------------------------------------------------


def test_child_env_puts_the_bootstrap_first():
    env = propagation.child_env(
        {"PYTHONPATH": f"/a{os.pathsep}{propagation.BOOTSTRAP_DIR}", "X": "1"}, {"OVERLAPCHECK_OUT": "/o"}
    )
    assert env["PYTHONPATH"].split(os.pathsep) == [propagation.BOOTSTRAP_DIR, "/a"]
    assert env["X"] == "1" and env["OVERLAPCHECK_OUT"] == "/o"
    assert os.path.isfile(os.path.join(propagation.BOOTSTRAP_DIR, "sitecustomize.py"))


def test_ds_env_file_merges_the_users_files_without_touching_them(tmp_path):
    home, cwd = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    cwd.mkdir()
    (home / ".deepspeed_env").write_text("NCCL_IB_HCA=mlx5\nFOO=home\n")
    (cwd / ".deepspeed_env").write_text("FOO=cwd\nPYTHONPATH=/user/lib\nNO_EQUALS_LINE\n")
    before = {p: p.read_text() for p in (home / ".deepspeed_env", cwd / ".deepspeed_env")}
    ours = {"OVERLAPCHECK_OUT": "/runs/a b", "PYTHONPATH": propagation.BOOTSTRAP_DIR}
    out = propagation.write_ds_env_file(str(tmp_path / "merged"), {}, ours, cwd=str(cwd), home=str(home))
    pairs = dict(propagation.parse_ds_env_file(Path(out).read_text()))
    assert pairs["NCCL_IB_HCA"] == "mlx5" and pairs["FOO"] == "cwd"  # DeepSpeed's order: home, then cwd
    assert pairs["OVERLAPCHECK_OUT"] == "/runs/a b"
    assert pairs["PYTHONPATH"].split(os.pathsep) == [str(cwd), propagation.BOOTSTRAP_DIR, "/user/lib"]
    assert {p: p.read_text() for p in before} == before


def test_ds_env_file_honours_a_custom_name(tmp_path):
    (tmp_path / "my.env").write_text("A=1\n")
    found = propagation.user_ds_env_files({"DS_ENV_FILE": "my.env"}, str(tmp_path), str(tmp_path))
    assert found == [str(tmp_path / "my.env")]  # home == cwd: read once


# ---- atomic writes -----------------------------------------------------------------------------------


def test_atomic_write_replaces_whole_file(tmp_path):
    target = tmp_path / "a.json"
    atomic_write_json(str(target), {"x": 1})
    atomic_write_json(str(target), {"x": 2})
    assert read_json(str(target)) == {"x": 2}
    assert os.listdir(tmp_path) == ["a.json"]


def test_failed_atomic_write_keeps_the_old_file_and_no_temp(tmp_path, monkeypatch):
    target = tmp_path / "a.bin"
    target.write_bytes(b"old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(UserError, match="disk full"):
        atomic_write_bytes(str(target), b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["a.bin"]


def test_read_json_of_partial_file_is_none(tmp_path):
    (tmp_path / "p.json").write_text('{"a": ')
    assert read_json(str(tmp_path / "p.json")) is None
    assert read_json(str(tmp_path / "missing.json")) is None


# ---- run folder --------------------------------------------------------------------------------------


def test_existing_run_folder_is_refused_without_force(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text('{"schema": "overlapcheck.run/1"}')  # an earlier run: --force replaces it
    (out / "traces").mkdir()
    (out / "traces" / "rank0.pt.trace.json.gz").write_bytes(b"x")
    (out / "rank0.summary.json").write_text("{}")
    (out / "notes.txt").write_text("mine")
    (out / ".rank1.123.tmp.json.gz").write_bytes(b"partial")
    with pytest.raises(UserError, match="--force"):
        session.prepare_out(str(out), force=False, join=False)
    session.prepare_out(str(out), force=False, join=True)  # node > 0 joins node 0's folder
    session.prepare_out(str(tmp_path / "new"), force=False, join=True)
    assert os.listdir(tmp_path / "new") == []  # a joining node creates nothing that node 0 would refuse
    session.prepare_out(str(out), force=True, join=False)
    assert sorted(os.listdir(out)) == ["notes.txt", "status", "traces"]  # only our files are removed
    assert os.listdir(out / "traces") == []


def test_cli_refuses_existing_folder_with_exit_2(tmp_path):
    (tmp_path / "run.json").write_text("{}")
    result = CliRunner().invoke(main, ["run", "--out", str(tmp_path), "--", sys.executable, "-c", "pass"])
    assert result.exit_code == 2
    assert "not empty" in result.output


@pytest.mark.parametrize(
    "args", [["--steps", "3:4", "--wait", "2"], ["--steps", "0:2"], ["--ranks", "x"], ["--wait", "0"]]
)
def test_cli_rejects_bad_options(tmp_path, args):
    result = CliRunner().invoke(main, ["run", "--out", str(tmp_path / "r"), *args, "--", "python", "-c", "1"])
    assert result.exit_code == 2, result.output
    assert not (tmp_path / "r").exists()


def test_cli_unknown_command_is_a_user_error(tmp_path):
    result = CliRunner().invoke(main, ["run", "--out", str(tmp_path / "r"), "--", "no-such-launcher-xyz"])
    assert result.exit_code == 2 and "command not found" in result.output
    assert not (tmp_path / "r").exists()


def test_per_node_launch_needs_out():
    with pytest.raises(UserError, match="--out"):
        session.run(
            ["torchrun", "--nnodes", "2", "--node_rank", "1", "t.py"],
            CaptureSettings("x", Schedule()),
            force=False,
            out_given=False,
        )


# ---- run.json merge ----------------------------------------------------------------------------------


def _launcher(node: int, finished: bool = True, code: int | None = 0) -> dict:
    return {
        "node_rank": node,
        "host": f"h{node}",
        "kind": "deepspeed",
        "command": ["deepspeed", str(node)],
        "cwd": "/w",
        "started_at": f"2026-01-01T00:00:0{node}+00:00",
        "finished_at": "2026-01-01T00:01:00+00:00" if finished else None,
        "exit_code": code,
        "profiler": {"wait": 2},
        "versions": {"torch": "2.13.0", "deepspeed": "0.19.8"},
        "env": {},
    }


def _rank_status(rank: int, state: str, **extra) -> dict:
    return {
        "rank": rank,
        "world_size": 3,
        "local_rank": 0,
        "host": f"h{rank}",
        "pid": 100 + rank,
        "backend": "gloo",
        "driver": "deepspeed",
        "versions": {"torch": "2.13.0+cpu", "cuda": None},
        "gpu": None,
        "env": {"NCCL_DEBUG": "INFO"},
        "cuda_sync_events": False,
        "ds_config": {"train_batch_size": 8} if rank == 0 else None,
        "capture": {"status": state, "error": None},
        "summary": {"status": "pending", "pid": 1},
        **extra,
    }


def test_merge_builds_the_manifest_from_status_files(tmp_path):
    out = str(tmp_path)
    os.makedirs(tmp_path / "status")
    atomic_write_json(layout.rank_status_path(out, 0), _rank_status(0, "ok"))
    atomic_write_json(layout.rank_status_path(out, 1), _rank_status(1, "recording"))
    atomic_write_json(layout.summary_status_path(out, 0), {"status": "ok", "seconds": 0.3})
    atomic_write_json(layout.launcher_status_path(out, 1), _launcher(1))
    os.makedirs(tmp_path / "traces")
    (tmp_path / "traces" / "rank0.pt.trace.json.gz").write_bytes(b"x")
    (tmp_path / "status" / "rank7.json").write_text("{broken")
    doc = manifest.merge(out, _launcher(0))
    assert doc["schema"] == "overlapcheck.run/1" and doc["status"] == "finished"
    assert doc["command"] == ["deepspeed", "0"] and doc["exit_code"] == 0
    assert [lt["node_rank"] for lt in doc["launches"]] == [0, 1]
    assert doc["world_size"] == 3 and doc["missing_ranks"] == [2] and doc["hosts"] == ["h0", "h1"]
    assert doc["ds_config"] == {"train_batch_size": 8}
    assert doc["versions"]["torch"] == "2.13.0+cpu" and doc["versions"]["deepspeed"] == "0.19.8"
    r0, r1 = doc["ranks"]
    assert r0["capture"]["trace"] == "traces/rank0.pt.trace.json.gz" and r0["summary"]["status"] == "ok"
    assert r0["summary"]["file"] == "rank0.summary.json" and "pid" not in r0["summary"]
    assert r1["capture"]["trace"] is None and "stopped" in r1["capture"]["error"]
    assert doc["errors"] == [{"source": os.path.join("status", "rank7.json"), "error": "unreadable status file"}]
    json.dumps(doc)


def test_merge_of_status_files_with_fields_of_the_wrong_type_keeps_the_rest(tmp_path):
    # was: int("one") or {**[...]} raised in merge(), after the job, and the launcher lost the job's exit code
    out = str(tmp_path)
    os.makedirs(tmp_path / "status")
    bad = _rank_status(0, "ok", world_size="one", versions=["torch"], capture=["ok"], summary="done", env=7)
    atomic_write_json(layout.rank_status_path(out, 0), {**bad, "errors": "none", "gpu": 5, "host": ["h0"]})
    atomic_write_json(layout.rank_status_path(out, 1), _rank_status(1, "ok"))
    atomic_write_json(layout.summary_status_path(out, 1), ["not", "a", "summary"])
    (tmp_path / "status" / "rankfoo.summary.json").write_text("{}")
    atomic_write_json(layout.launcher_status_path(out, 1), {**_launcher(1), "versions": "x", "finished_at": 3})
    doc = manifest.merge(out, {**_launcher(0), "profiler": [1], "env": None})
    assert doc["world_size"] == 3 and doc["missing_ranks"] == [2] and doc["hosts"] == ["h0", "h1"]
    assert doc["versions"]["torch"] == "2.13.0" and doc["env"] == {}  # rank 0 leads; its env is no dict
    assert [r["rank"] for r in doc["ranks"]] == [0, 1] and doc["ranks"][0]["errors"] == []
    assert {"source": os.path.join("status", "rank1.summary.json"), "error": "unreadable status file"} in doc["errors"]
    plan = launchers.plan(["python", "train.py"], [])
    assert isinstance(session.capture_notes(doc, plan, {}, 0), list)
    json.dumps(doc)


def test_merge_is_running_until_every_launcher_finished(tmp_path):
    os.makedirs(tmp_path / "status")
    atomic_write_json(layout.launcher_status_path(str(tmp_path), 1), _launcher(1, finished=False, code=None))
    doc = manifest.merge(str(tmp_path), _launcher(0))
    assert doc["status"] == "running" and doc["finished_at"] is None


def test_wait_for_summaries_skips_dead_processes(tmp_path):
    out = str(tmp_path)
    os.makedirs(tmp_path / "status")
    import socket
    import subprocess

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    status = _rank_status(0, "ok")
    status["summary"] = {"status": "pending", "pid": dead.pid, "host": socket.gethostname()}
    atomic_write_json(layout.rank_status_path(out, 0), status)
    alive = _rank_status(1, "ok")
    alive["summary"] = {"status": "pending", "pid": os.getpid(), "host": socket.gethostname()}
    atomic_write_json(layout.rank_status_path(out, 1), alive)
    assert session.wait_for_summaries(out, timeout=0.3, poll=0.05) == [1]
    atomic_write_json(layout.summary_status_path(out, 1), {"status": "ok"})
    assert session.wait_for_summaries(out, timeout=5, poll=0.05) == []


# ---- supervisor --------------------------------------------------------------------------------------


def test_child_exit_code_is_returned():
    from overlapcheck.capture import supervisor

    assert supervisor.run_child([sys.executable, "-c", "import sys; sys.exit(7)"], os.environ) == 7
    assert supervisor.run_child([sys.executable, "-c", "import os; os.kill(os.getpid(), 15)"], os.environ) == -15


def test_signals_we_were_started_with_ignored_are_not_forwarded():
    import subprocess

    child = (
        "import signal, time\n"
        "signal.signal(signal.SIGHUP, lambda *a: print('child got SIGHUP', flush=True))\n"
        "print('ready', flush=True)\n"
        "time.sleep(1.5)\n"
    )
    parent = (
        "import os, signal, sys, threading\n"
        "from overlapcheck.capture.supervisor import run_child\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)  # as under nohup\n"
        "threading.Timer(0.8, os.kill, (os.getpid(), signal.SIGHUP)).start()\n"
        f"sys.exit(run_child([sys.executable, '-c', {child!r}], dict(os.environ)))\n"
    )
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "ready" and "SIGHUP" not in out.stdout
