"""Real jobs through `overlapcheck run`: a tiny DeepSpeed ZeRO-3 model (1.3M parameters, overlap_comm),
2 ranks, gloo on CPU, launched with deepspeed, torchrun, and two loopback "nodes" (--no_ssh).

Every job has a timeout. The first deepspeed launch in a fresh environment JIT-builds DeepSpeed's shm comm op
(about a minute on 2 cores, cached per environment: builders.torch_extensions_dir), hence the generous limits.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from builders import torch_extensions_dir

# found, not imported: the jobs import them; importing deepspeed here would cost every xdist worker seconds at
# collection, and only the one that runs the launcher group needs them
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("deepspeed") is None:
    pytest.skip("needs torch and deepspeed (the capture extra)", allow_module_level=True)

pytestmark = pytest.mark.launcher

JOBS = Path(__file__).parent / "jobs"
TRAIN = str(JOBS / "train_zero3.py")
WINDOW = ["--wait", "2", "--warmup", "1", "--active", "2"]  # records steps 3 and 4
JOB_STEPS = ["--steps", "6"]
JOB_TIMEOUT = 420  # seconds; includes a possible first-time JIT build


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERLAPCHECK_")}
    env.update(
        DS_ACCELERATOR="cpu",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        PATH=os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", ""),
        TORCH_EXTENSIONS_DIR=torch_extensions_dir(),
    )
    env.update(extra)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _overlapcheck_run(out: Path, command: list[str]) -> list[str]:
    return [sys.executable, "-m", "overlapcheck", "run", "--out", str(out), *WINDOW, "--", *command]


def _spawn(out: Path, command: list[str], cwd: Path, log: Path, **env: str) -> subprocess.Popen:
    """Start `overlapcheck run` in its own process group (so that a timeout can stop the whole job)."""
    with open(log, "wb") as fh:
        return subprocess.Popen(
            _overlapcheck_run(out, command),
            cwd=cwd,
            env=_env(**env),
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait_all(procs: list[subprocess.Popen], timeout: float = JOB_TIMEOUT) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _run(out: Path, command: list[str], cwd: Path, **env: str) -> tuple[int, str]:
    """Run `overlapcheck run -- command`; returns (exit code, output)."""
    log = cwd / f"{out.name}.log"
    (code,) = _wait_all([_spawn(out, command, cwd, log, **env)])
    return code, log.read_text(errors="replace")


def _manifest(out: Path) -> dict[str, Any]:
    return json.loads((out / "run.json").read_text())


def _assert_captured(out: Path, command: list[str], launcher: str) -> dict[str, Any]:
    """One trace and one summary per rank, and a manifest that says so."""
    traces = sorted(p.name for p in (out / "traces").glob("rank*.pt.trace.json.gz"))
    assert traces == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    assert not list(out.glob("*.json.gz"))  # the traces are alone in traces/, for HTA and TensorBoard
    run = _manifest(out)
    assert run["schema"] == "overlapcheck.run/1" and run["status"] == "finished"
    assert run["command"] == command and run["launcher"] == launcher and run["exit_code"] == 0
    assert run["world_size"] == 2 and run["backend"] == "gloo" and run["hosts"]
    cfg = run["ds_config"]  # as the engine used it: train_batch_size resolved (4 per rank x 2 ranks)
    assert cfg["train_batch_size"] == 8 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["zero_optimization"]["stage"] == 3 and cfg["zero_optimization"]["overlap_comm"] is True
    assert run["versions"]["torch"].startswith("2.") and run["versions"]["deepspeed"]
    assert run["env"]["DS_ACCELERATOR"] == "cpu"
    assert run["profiler"]["first_step"] == 3 and run["profiler"]["last_step"] == 4
    for rank in run["ranks"]:
        assert rank["capture"]["status"] == "ok", rank
        assert rank["capture"]["trace"] == f"traces/rank{rank['rank']}.pt.trace.json.gz"
        assert rank["summary"]["status"] == "ok", rank
        summary = (out / rank["summary"]["file"]).read_bytes()  # what `report` checks the summary against
        assert rank["summary"]["sha256"] == hashlib.sha256(summary).hexdigest(), rank
        assert rank["capture"]["trace_bytes"] == (out / rank["capture"]["trace"]).stat().st_size, rank
        assert rank["driver"] == "deepspeed"
    assert [r["rank"] for r in run["ranks"]] == [0, 1] and run["missing_ranks"] == []
    return run


def _assert_report_sees_zero3_collectives(out: Path) -> None:
    """The report (from the per-rank summaries) finds reduce-scatters and all-gathers on every rank."""
    from overlapcheck.pipeline import analyze

    report = analyze(out, jobs=1)
    assert report.errors == []
    assert not any("run.json records" in n for n in report.notes or []), report.notes  # its own files pass
    assert all("was not used" not in n for r in report.ranks for n in r.notes), [r.notes for r in report.ranks]
    assert [r.rank for r in report.ranks] == [0, 1]
    for rank in report.ranks:
        assert rank.lanes == "cpu"
        assert rank.collectives["reduce_scatter"].count > 0, rank.rank
        assert rank.collectives["all_gather"].count > 0, rank.rank
    assert report.run is not None and report.run["world_size"] == 2


def test_deepspeed_launcher(tmp_path):
    out = tmp_path / "run"
    command = ["deepspeed", "--num_gpus", "2", "--master_port", str(_free_port()), TRAIN, *JOB_STEPS]
    code, output = _run(out, command, tmp_path)
    assert code == 0, output[-3000:]
    run = _assert_captured(out, command, "deepspeed")
    assert run["launches"][0]["ds_env_file"]  # DeepSpeed's env-file mechanism was prepared
    _assert_report_sees_zero3_collectives(out)
    cli = subprocess.run(
        [sys.executable, "-m", "overlapcheck", "analyze", str(out), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cli.returncode == 0, cli.stderr
    doc = json.loads(cli.stdout)
    assert all(r["collectives"]["all_gather"]["count"] > 0 for r in doc["ranks"])


def test_torchrun_launcher(tmp_path):
    out = tmp_path / "run"
    command = ["torchrun", "--nproc_per_node", "2", "--master_port", str(_free_port()), TRAIN, *JOB_STEPS]
    code, output = _run(out, command, tmp_path)
    assert code == 0, output[-3000:]
    _assert_captured(out, command, "torchrun")
    _assert_report_sees_zero3_collectives(out)
    _assert_hta_opens_the_traces(out)


def _assert_hta_opens_the_traces(out: Path) -> None:
    """HolisticTraceAnalysis reads every .json/.gz file of the folder it is given: the run folder keeps its traces
    alone in traces/, so HTA opens them as the README says (run.json and the summaries stay out of its way)."""
    hta = pytest.importorskip("hta.trace_analysis")
    analysis = hta.TraceAnalysis(trace_dir=str(out / "traces"))
    assert sorted(analysis.t.traces) == [0, 1]


def test_two_loopback_nodes_with_a_hostfile(tmp_path):
    out = tmp_path / "run"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    port = str(_free_port())

    def node(n: int) -> list[str]:
        return [
            "deepspeed",
            "--hostfile",
            str(hostfile),
            "--no_ssh",
            "--node_rank",
            str(n),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            port,
            TRAIN,
            *JOB_STEPS,
        ]

    logs = [tmp_path / f"node{n}.log" for n in (0, 1)]
    procs = []
    for n in (1, 0):  # node 1 first: its launch must not trip node 0's check of the run folder
        procs.append(_spawn(out, node(n), tmp_path, logs[n]))
        time.sleep(0.5)
    codes = _wait_all(procs)
    assert codes == [0, 0], "\n".join(log.read_text(errors="replace")[-2000:] for log in logs)
    run = _assert_captured(out, node(0), "deepspeed")
    assert [lt["node_rank"] for lt in run["launches"]] == [0, 1]
    assert [lt["per_node"] for lt in run["launches"]] == [True, True]
    assert [lt["exit_code"] for lt in run["launches"]] == [0, 0]
    _assert_report_sees_zero3_collectives(out)


def test_failing_job_exit_code_is_returned_and_traces_survive(tmp_path):
    out = tmp_path / "run"
    # rank 1 exits with code 3 right after the window closes; the deepspeed launcher returns that code
    command = [
        "deepspeed",
        "--num_gpus",
        "2",
        "--master_port",
        str(_free_port()),
        TRAIN,
        *JOB_STEPS,
        "--fail-at",
        "4",
        "--fail-rank",
        "1",
    ]
    code, output = _run(out, command, tmp_path)
    assert code == 3, output[-3000:]
    run = _manifest(out)
    assert run["exit_code"] == 3 and run["status"] == "finished"
    assert (out / "traces" / "rank0.pt.trace.json.gz").is_file() and (
        out / "traces" / "rank1.pt.trace.json.gz"
    ).is_file()
    assert [r["capture"]["status"] for r in run["ranks"]] == ["ok", "ok"]


def test_a_profiler_that_raises_does_not_stop_the_job(tmp_path):
    out = tmp_path / "run"
    command = ["torchrun", "--nproc_per_node", "2", "--master_port", str(_free_port()), TRAIN, *JOB_STEPS]
    code, output = _run(out, command, tmp_path, OVERLAPCHECK_TEST_FAIL_PROFILER="1")
    assert code == 0, output[-3000:]
    run = _manifest(out)
    assert run["exit_code"] == 0 and not list(out.glob("**/rank*.trace.json.gz"))
    assert len(run["ranks"]) == 2
    for rank in run["ranks"]:
        assert rank["capture"]["status"] == "failed"
        assert "InjectedFailure" in rank["capture"]["error"]
    assert "rank 0: InjectedFailure" in output


def test_plain_python_job_uses_the_optimizer_step(tmp_path):
    out = tmp_path / "run"
    code, output = _run(out, [sys.executable, str(JOBS / "train_plain.py")], tmp_path)
    assert code == 0, output[-3000:]
    run = _manifest(out)
    assert run["launcher"] == "python" and run["world_size"] == 1
    (rank,) = run["ranks"]
    assert rank["driver"] == "optimizer" and rank["capture"]["status"] == "ok"
    assert rank["summary"]["status"] == "ok"
    assert run["ds_config"] is None


def test_sigterm_is_forwarded_and_the_exit_code_kept(tmp_path):
    ready, got = tmp_path / "ready", tmp_path / "got"
    out = tmp_path / "run"
    proc = subprocess.Popen(
        _overlapcheck_run(out, [sys.executable, str(JOBS / "sigterm_job.py"), str(ready), str(got)]),
        cwd=tmp_path,
        env=_env(),
    )
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 42
    finally:
        if proc.poll() is None:
            proc.kill()
    assert got.read_text() == str(int(signal.SIGTERM))
    assert _manifest(out)["exit_code"] == 42


def test_multi_node_deepspeed_gets_the_capture_env_through_its_env_file(tmp_path):
    """DeepSpeed's multi-node runner over (a loopback stand-in for) pdsh: each "remote" rank starts from
    an empty environment, so the capture settings can only arrive through the runner's env file, which
    must still carry the user's own .deepspeed_env lines and leave that file untouched."""
    out = tmp_path / "run"
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=1\n127.0.0.1 slots=1\n")
    # (the extension folder too: the ranks would otherwise build the shm op in the default one)
    user_env = (
        f"DS_ACCELERATOR=cpu\nOMP_NUM_THREADS=1\nNCCL_DEBUG=WARN\nTORCH_EXTENSIONS_DIR={torch_extensions_dir()}\n"
    )
    (tmp_path / ".deepspeed_env").write_text(user_env)
    command = [
        "deepspeed",
        "--hostfile",
        str(hostfile),
        "--no_ssh_check",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        TRAIN,
        *JOB_STEPS,
    ]
    fake_pdsh = str(JOBS / "fake_pdsh")
    code, output = _run(out, command, tmp_path, PATH=fake_pdsh + os.pathsep + _env()["PATH"])
    assert code == 0, output[-3000:]
    assert "pdsh" in output  # the runner took its multi-node path
    run = _assert_captured(out, command, "deepspeed")
    assert run["env"]["NCCL_DEBUG"] == "WARN"  # the user's env-file line reached the ranks
    assert (tmp_path / ".deepspeed_env").read_text() == user_env


def test_a_job_that_ends_inside_the_window_is_said_incomplete(tmp_path):
    out = tmp_path / "run"
    # the window records steps 3 and 4; the job stops after step 3
    code, output = _run(out, [sys.executable, str(JOBS / "train_plain.py"), "--steps", "4"], tmp_path)
    assert code == 0, output[-3000:]
    assert "capture incomplete on 1 ranks" in output and "steps 3-3 of 3-4 recorded" in output
    run = _manifest(out)
    (rank,) = run["ranks"]
    assert rank["capture"]["status"] == "failed" and rank["capture"]["complete"] is False
    assert rank["capture"]["steps_captured"] == {"first": 3, "last": 3}
    assert run["incomplete_ranks"] == [0] and any("capture incomplete" in n for n in run["notes"])
    assert (out / "traces" / "rank0.pt.trace.json.gz").is_file()


def test_a_helper_process_that_inherits_rank_does_not_capture_it(tmp_path):
    import gzip

    out, pids = tmp_path / "run", tmp_path / "pids"
    code, output = _run(
        out, [sys.executable, str(JOBS / "helper_job.py"), str(pids)], tmp_path, RANK="0", WORLD_SIZE="1"
    )
    assert code == 0, output[-3000:]
    who = dict(line.split() for line in pids.read_text().splitlines())
    assert "also steps an optimizer as rank 0" in output
    run = _manifest(out)
    (rank,) = run["ranks"]
    assert rank["pid"] == int(who["main"]) and rank["capture"]["status"] == "ok", rank
    events = json.loads(gzip.decompress((out / "traces" / "rank0.pt.trace.json.gz").read_bytes()))["traceEvents"]
    pids_in_trace = {e.get("pid") for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"}
    assert pids_in_trace == {int(who["main"])}
