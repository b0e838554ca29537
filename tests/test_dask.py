"""`--scheduler` / `analyze(scheduler=)`: the per-rank work on a real dask.distributed cluster (a LocalCluster
of two worker processes on loopback), against the same analysis run locally: the same report, a worker killed
mid-run (its tasks retried elsewhere), a bad file on one worker, an unreachable scheduler."""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from builders import ROOT, kernel, launch, step, write_trace
from click.testing import CliRunner

import overlapcheck
from overlapcheck import executors, pipeline
from overlapcheck.cli import main
from overlapcheck.report.json import JsonRenderer

distributed = pytest.importorskip("distributed")

SAMPLES = ROOT / "sample_traces"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


@pytest.fixture(scope="module")
def client() -> Iterator[distributed.Client]:
    """Two single-threaded worker processes that import this checkout (PYTHONPATH: the one installed in the
    environment may be another checkout's)."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *([old] if old else [])])
    try:
        cluster = distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        )
    finally:
        if old is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = old
    with cluster, distributed.Client(cluster) as c:
        files = c.run(lambda: __import__("overlapcheck").__file__)
        assert all(f.startswith(str(ROOT)) for f in files.values()), files
        yield c


@pytest.fixture
def address(client: distributed.Client) -> str:
    client.wait_for_workers(2, timeout=60)
    return client.scheduler.address


def tiny_rank(folder: Path, rank: int, world: int) -> Path:
    """A rank of a few steps: compute on stream 7, an all-gather and a reduce-scatter on stream 13, some hidden."""
    events = []
    corr = 1
    t = 100.0
    for s in range(3):
        events.append(step(s, t, 600.0))
        for name, stream, start, dur in (
            (AG, 13, 10, 40 + rank),
            ("sgemm", 7, 55, 120),
            (RS, 13, 100, 90),
            ("sgemm", 7, 180, 100),
        ):
            events.append(launch(t + start - 8, corr))
            events.append(kernel(name, t + start, dur, stream=stream, corr=corr))
            corr += 1
        t += 700.0
    return write_trace(folder, f"rank{rank}.trace.json", events, rank=rank, world_size=world, gz=False)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("ranks")
    for rank in range(12):
        tiny_rank(folder, rank, 12)
    return folder


def _json(report: overlapcheck.Report) -> str:
    return JsonRenderer().render(report)


def test_the_report_is_the_local_one(address: str) -> None:
    for folder in (SAMPLES / "straggler", SAMPLES / "clock-skew"):
        local = overlapcheck.analyze(folder, jobs=1, timelines=True)
        remote = overlapcheck.analyze(folder, scheduler=address, timelines=True)
        assert _json(remote) == _json(local)
        assert remote.timelines == local.timelines and remote.timelines  # the HTML page's and Perfetto's input


def test_cli_relative_paths_and_progress(address: str, ranks: Path, tmp_path: Path, monkeypatch) -> None:
    """Workers resolve relative paths against the client's folder, and the report names them as given."""
    monkeypatch.chdir(ranks.parent)
    local, remote = tmp_path / "local.json", tmp_path / "remote.json"
    args = ["analyze", ranks.name, "--format", "json", "-o"]
    assert CliRunner().invoke(main, [*args, str(local), "-j", "1"]).exit_code == 0
    result = CliRunner().invoke(main, [*args, str(remote), "--scheduler", address])
    assert result.exit_code == 0, result.output
    assert remote.read_text() == local.read_text()
    assert json.loads(remote.read_text())["ranks"][0]["source"] == os.path.join(ranks.name, "rank0.trace.json")
    inputs = pipeline.find_inputs([ranks.name])
    seen: list[int] = []
    pipeline.analyze_inputs(inputs, pipeline.job_context(inputs), scheduler=address, on_bytes=seen.append)
    assert len(seen) == inputs.count and sum(seen) == inputs.total_bytes  # one step per finished future


def test_a_worker_killed_mid_run_is_retried(client: distributed.Client, address: str, ranks: Path) -> None:
    local = overlapcheck.analyze(ranks, jobs=1)
    pids = client.run(os.getpid)
    killed: list[tuple[str, int]] = []

    def kill_one(n: int) -> None:
        if killed:
            return
        busy = {w: keys for w, keys in client.processing().items() if keys}
        if busy:  # a worker with tasks in hand: kill its process; the scheduler gives them to the other
            worker, keys = next(iter(busy.items()))
            os.kill(pids[worker], signal.SIGKILL)
            killed.append((worker, len(keys)))

    inputs = pipeline.find_inputs([ranks])
    # a window of 2 tasks in flight, so the kill lands while most of the files are still to be analyzed
    executor = executors.DaskExecutor(address, window=2)
    outcomes = executor.run(
        pipeline._worker, inputs.traces, pipeline.job_context(inputs), pipeline.Options(), {}, kill_one
    )
    assert killed and killed[0][1] >= 1
    assert [o[2] for o in outcomes] == [None] * len(inputs.traces)
    report = pipeline.build_report(outcomes, inputs, pipeline.job_context(inputs), pipeline.Options())
    assert _json(report) == _json(local)


def test_a_bad_file_is_the_same_one_line_error(address: str, ranks: Path, tmp_path: Path) -> None:
    folder = tmp_path / "bad"
    shutil.copytree(ranks, folder)
    (folder / "rank5.trace.json").write_text('{"traceEvents": [{"ph": "X", "ts": ')
    local = overlapcheck.analyze(folder, jobs=1)
    remote = overlapcheck.analyze(folder, scheduler=address)
    assert [e.source for e in remote.errors] == [str(folder / "rank5.trace.json")]
    assert remote.errors == local.errors and "\n" not in remote.errors[0].error
    assert remote.errors[0].error.startswith(str(folder / "rank5.trace.json"))
    assert _json(remote) == _json(local)
    result = CliRunner().invoke(main, ["analyze", str(folder), "--format", "json", "--scheduler", address])
    assert result.exit_code == 2
    assert f"overlapcheck: error: {local.errors[0].error}" in result.stderr


def test_an_unreachable_scheduler_is_one_line(monkeypatch, ranks: Path) -> None:
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(executors, "CONNECT_TIMEOUT_S", 1.0)
    for command in (["analyze", str(ranks)], ["compare", str(ranks), str(ranks)]):
        result = CliRunner().invoke(main, [*command, "--scheduler", f"tcp://127.0.0.1:{port}"])
        assert result.exit_code == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"overlapcheck: error: cannot reach the Dask scheduler at tcp://127.0.0.1:{port}"
        ), result.stderr
