"""Rank-side unit tests: post-import hooks, the step clock, the profiler window, the summary process."""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path

import pytest
from builders import kernel, launch, step, write_trace

from overlapcheck.capture import hook, layout
from overlapcheck.capture.atomic import read_json
from overlapcheck.capture.rank import RankCapture
from overlapcheck.capture.settings import CaptureSettings, Schedule
from overlapcheck.capture.summary import write_summary


def test_post_import_hook_runs_after_the_module_and_restores_its_loader(tmp_path, monkeypatch):
    (tmp_path / "ocfake_target.py").write_text("VALUE = 41\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = hook._PostImportFinder("ocfake_target", lambda m: seen.append(m.VALUE + 1))
    sys.meta_path.insert(0, finder)
    try:
        import ocfake_target  # noqa: F401

        assert seen == [42]
        assert type(ocfake_target.__spec__.loader).__name__ == "SourceFileLoader"
        assert finder not in sys.meta_path
    finally:
        sys.modules.pop("ocfake_target", None)
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)


def test_a_failing_callback_does_not_break_the_import(tmp_path, monkeypatch, capsys):
    (tmp_path / "ocfake_boom.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def boom(module):
        raise RuntimeError("patch failed")

    sys.meta_path.insert(0, hook._PostImportFinder("ocfake_boom", boom))
    try:
        import ocfake_boom

        assert ocfake_boom.X == 1
        assert "patch failed" in capsys.readouterr().err
    finally:
        sys.modules.pop("ocfake_boom", None)


def _capture(tmp_path, schedule: Schedule, monkeypatch, rank: int = 0) -> RankCapture:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    os.makedirs(tmp_path / layout.STATUS_DIR, exist_ok=True)
    return RankCapture(CaptureSettings(str(tmp_path), schedule))


def test_engine_is_the_clock_and_the_first_optimizer_otherwise(tmp_path, monkeypatch):
    cap = _capture(tmp_path, Schedule(wait=100), monkeypatch)
    a, b = object(), object()
    for _ in range(3):
        cap.on_step("optimizer", a)
        cap.on_step("optimizer", b)
    assert cap.driver == "optimizer" and cap.profiler.steps_done == 3
    cap.on_step("deepspeed", object())
    cap.on_step("optimizer", a)  # the engine's inner optimizer: not a second clock
    assert cap.driver == "deepspeed" and cap.profiler.steps_done == 4


def test_window_not_reached_is_recorded_at_exit(tmp_path, monkeypatch):
    cap = _capture(tmp_path, Schedule(wait=5), monkeypatch, rank=1)
    cap.on_step("optimizer", object())
    assert read_json(layout.rank_status_path(str(tmp_path), 1))["capture"]["status"] == "waiting"
    cap.at_exit()
    status = read_json(layout.rank_status_path(str(tmp_path), 1))
    assert status["capture"]["status"] == "not_reached" and "1 optimizer steps" in status["capture"]["error"]
    assert status["rank"] == 1 and status["world_size"] == 2


def test_ranks_not_chosen_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "3")
    cap = RankCapture(CaptureSettings(str(tmp_path), Schedule(wait=1), ranks="0-2"))
    cap.on_step("optimizer", object())
    cap.on_step("optimizer", object())
    assert cap.profiler is None
    assert read_json(layout.rank_status_path(str(tmp_path), 3))["capture"]["status"] == "skipped"


def _train(cap: RankCapture, steps: int) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(16, 16)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
        cap.on_step("optimizer", opt)


def test_profiler_window_writes_one_trace_atomically(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setattr(RankCapture, "_start_summary", lambda self: None)
    cap = _capture(tmp_path, Schedule(wait=2, warmup=1, active=2), monkeypatch)
    _train(cap, 7)
    assert cap.profiler.state == "ok", cap.profiler.error
    trace = Path(layout.trace_path(str(tmp_path), 0))
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    steps = sorted({e["name"] for e in doc["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#3", "ProfilerStep#4"]  # warm-up step 2 is not recorded
    assert not [n for n in os.listdir(trace.parent) if n.endswith(".tmp") or n.startswith(".")]
    status = read_json(layout.rank_status_path(str(tmp_path), 0))
    assert status["capture"]["status"] == "ok" and status["capture"]["trace"] == "traces/rank0.pt.trace.json.gz"


def test_a_profiler_that_raises_does_not_stop_the_loop(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("OVERLAPCHECK_TEST_FAIL_PROFILER", "1")
    cap = _capture(tmp_path, Schedule(wait=1, warmup=0, active=1), monkeypatch)
    _train(cap, 4)
    status = read_json(layout.rank_status_path(str(tmp_path), 0))
    assert status["capture"]["status"] == "failed"
    assert "InjectedFailure" in status["capture"]["error"]
    assert not os.path.exists(layout.trace_path(str(tmp_path), 0))


def test_summary_writes_a_one_rank_report(tmp_path):
    events = [
        step(5, 0, 100),
        launch(1, 1),
        kernel("gemm", 10, 40, corr=1),
        kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*)", 30, 40, stream=20),
    ]
    trace = write_trace(tmp_path, "rank0.trace.json.gz", events)
    ok = write_summary(str(trace), str(tmp_path / "s.json"), str(tmp_path / "st.json"))
    assert ok and read_json(str(tmp_path / "st.json"))["status"] == "ok"
    doc = read_json(str(tmp_path / "s.json"))
    assert doc["schema"] == "overlapcheck.report/1" and isinstance(doc["findings"], list)
    (rank,) = doc["ranks"]
    assert rank["rank"] == 0 and rank["source"] == "rank0.trace.json.gz"
    assert rank["collectives"]["reduce_scatter"]["count"] == 1


def test_summary_of_a_broken_trace_fails_quietly(tmp_path):
    (tmp_path / "rank0.trace.json.gz").write_bytes(b"not gzip")
    ok = write_summary(str(tmp_path / "rank0.trace.json.gz"), str(tmp_path / "s.json"), str(tmp_path / "st.json"))
    status = read_json(str(tmp_path / "st.json"))
    assert not ok and status["status"] == "failed" and status["error"]
    assert not (tmp_path / "s.json").exists()


def test_an_unexpected_error_stops_the_capture_once_and_is_recorded(tmp_path, monkeypatch):
    from overlapcheck.capture.profiler import StepProfiler

    calls = []

    def broken_tick(self):
        calls.append(1)
        raise KeyError("boom")

    monkeypatch.setattr(StepProfiler, "tick", broken_tick)
    cap = _capture(tmp_path, Schedule(wait=2), monkeypatch)
    for _ in range(5):
        cap.on_step("optimizer", cap)
    assert len(calls) == 1  # no retry on every step
    status = read_json(layout.rank_status_path(str(tmp_path), 0))
    assert status["capture"]["status"] == "failed" and "KeyError" in status["capture"]["error"]
