"""The per-rank profiler: a bounded torch.profiler window driven by optimizer steps, atomic trace export.

Outside the window nothing is installed: the profiler object is created at the start of the warm-up and
destroyed right after the export, so steps before and after it run exactly as unprofiled steps do.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any

from overlapcheck.capture import layout
from overlapcheck.capture.settings import ENV_TEST_FAIL_PROFILER, Schedule


class InjectedFailure(RuntimeError):
    """Raised on purpose when OVERLAPCHECK_TEST_FAIL_PROFILER=1 (tests of the never-hurt-the-job rule)."""


def one_line(exc: BaseException) -> str:
    """An exception as one line: its type, message and where it was raised."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    message = " ".join(str(exc).split())[:500]
    return f"{type(exc).__name__}: {message}{where}"


def make_profiler(
    schedule: Schedule, with_stack: bool, on_trace_ready: Callable[[Any], None], with_modules: bool = False
) -> Any:
    """A torch.profiler.profile whose step numbers are the training's step numbers (it starts at `wait`);
    `with_modules` records module frames (with the stacks, which carry them in eager mode)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler import schedule as torch_schedule

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    base = torch_schedule(wait=0, warmup=schedule.warmup, active=schedule.active, repeat=1)
    offset = schedule.wait
    kwargs: dict[str, Any] = {}
    config = _experimental_config()
    if config is not None:
        kwargs["experimental_config"] = config
    prof = profile(
        activities=activities,
        schedule=lambda step: base(max(0, step - offset)),
        on_trace_ready=on_trace_ready,
        record_shapes=True,
        with_stack=with_stack or with_modules,
        with_modules=with_modules,
        **kwargs,
    )
    prof.step_num = offset  # name the first ProfilerStep after the training step it covers
    return prof


def _experimental_config() -> Any | None:
    """`_ExperimentalConfig(enable_cuda_sync_events=True)` when this torch has it and CUDA is in use."""
    try:
        import torch
        from torch._C._profiler import _ExperimentalConfig

        if not torch.cuda.is_available():
            return None
        return _ExperimentalConfig(enable_cuda_sync_events=True)
    except (ImportError, TypeError, AttributeError):
        return None


def cuda_sync_events_supported() -> bool:
    return _experimental_config() is not None


class StepProfiler:
    """Counts optimizer steps and runs the profiler over steps [wait, wait + warmup + active).

    `tick()` is called after every optimizer step. The first call that completes step `wait - 1`
    starts the profiler; the call that completes the last recorded step exports the trace.
    Any failure is recorded in `self.error` and the profiler is dropped; nothing is ever raised.
    """

    def __init__(
        self,
        out: str,
        rank: int,
        schedule: Schedule,
        with_stack: bool,
        on_state: Callable[[StepProfiler], None],
        may_write: Callable[[], bool] | None = None,
        with_modules: bool = False,
    ):
        self.out, self.rank, self.schedule, self.with_stack = out, rank, schedule, with_stack
        self.with_modules = with_modules
        self.on_state = on_state
        self.may_write = may_write  # False: another process owns this rank now; write no trace
        self.steps_done = 0
        self.state = "waiting"  # waiting -> recording -> ok | failed
        self.error: str | None = None
        self.trace_bytes: int | None = None
        self.export_s: float | None = None
        self.steps_captured: tuple[int, int] | None = None  # first and last step whole in the exported trace
        self._prof: Any = None

    def tick(self) -> None:
        self.steps_done += 1
        if self.state == "waiting" and self.steps_done == self.schedule.wait:
            self._guard(self._start)
        elif self.state == "recording":
            self._guard(self._step)

    def _start(self) -> None:
        if os.environ.get(ENV_TEST_FAIL_PROFILER) == "1":
            raise InjectedFailure("profiler failure injected by OVERLAPCHECK_TEST_FAIL_PROFILER=1")
        self._prof = make_profiler(self.schedule, self.with_stack, self._export, self.with_modules)
        self._prof.start()
        self.state = "recording"
        self.on_state(self)

    def _step(self) -> None:
        self._prof.step()  # on the step after the last recorded one this calls _export
        if self.steps_done > self.schedule.last:
            prof, self._prof = self._prof, None
            prof.stop()
            if self.state == "recording":
                raise RuntimeError("the profiler window closed without producing a trace")

    def _export(self, prof: Any) -> None:
        if self.may_write is not None and not self.may_write():
            raise RuntimeError("another process captures this rank now; this one wrote no trace")
        started = time.perf_counter()
        final = layout.trace_path(self.out, self.rank)
        # never named like a trace (*.json.gz): a killed export is not read as one
        tmp = layout.trace_tmp_path(self.out, self.rank, socket.gethostname(), os.getpid())
        os.makedirs(os.path.dirname(final), exist_ok=True)
        try:
            prof.export_chrome_trace(tmp)  # ".gz": torch gzips it
            os.replace(tmp, final)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.export_s = time.perf_counter() - started
        self.trace_bytes = os.path.getsize(final)
        last = min(self.schedule.last, self.steps_done - 1)  # the job may end inside the window
        self.steps_captured = (self.schedule.first, last) if last >= self.schedule.first else None
        self.state = "ok"
        self.on_state(self)

    @property
    def complete(self) -> bool:
        """Whether the trace holds every step of the window."""
        return self.state == "ok" and self.steps_captured == (self.schedule.first, self.schedule.last)

    def finish_early(self) -> None:
        """At process exit: close an open window (the job ended inside it). torch exports what was recorded
        when the window was past its warm-up: a partial trace, kept, and marked failed with the steps it has."""
        if self._prof is not None:
            prof, self._prof = self._prof, None
            with contextlib.suppress(Exception):
                prof.stop()
            sch = self.schedule
            if self.steps_captured is not None:
                got = f"steps {self.steps_captured[0]}-{self.steps_captured[1]} of {sch.first}-{sch.last} recorded"
            else:
                got = f"no step of {sch.first}-{sch.last} recorded"
            self.state = "failed"
            self.error = f"the job ended after {self.steps_done} optimizer steps, inside the window: {got}"

    def _guard(self, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception as exc:  # noqa: BLE001 - the profiler must never stop the job
            self.state, self.error = "failed", one_line(exc)
            prof, self._prof = self._prof, None
            if prof is not None:
                with contextlib.suppress(Exception):
                    prof.stop()
            with contextlib.suppress(Exception):
                self.on_state(self)
