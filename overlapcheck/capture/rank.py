"""One rank's capture: picks the step clock, runs the profiler, writes its status file, starts its summary.

The status file `status/rank<R>.json` is written only by this rank (atomically); the launcher merges all
of them into run.json. Every method here swallows its own errors: capture must never stop the job.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from overlapcheck.capture import layout, rankinfo
from overlapcheck.capture.atomic import atomic_write_json
from overlapcheck.capture.profiler import StepProfiler, cuda_sync_events_supported, one_line
from overlapcheck.capture.settings import ENV_DISABLE, CaptureSettings


class RankCapture:
    """Created lazily by `hook.controller()` in a process that steps an optimizer."""

    def __init__(self, settings: CaptureSettings):
        self.settings = settings
        self.driver: str | None = None  # "deepspeed" or "optimizer": what ticks the profiler
        self._clock: int | None = None  # id() of the optimizer used as the clock
        self.ds_config: dict[str, Any] | None = None
        self.profiler: StepProfiler | None = None
        self.identity: dict[str, Any] | None = None
        self.skipped = False
        self.broken = False  # an unexpected error: the capture stopped on this rank
        self.summary: dict[str, Any] = {"status": "not_started"}
        self.errors: list[str] = []

    # -- events from the hooks ------------------------------------------------------------------------

    def on_engine(self, engine: Any) -> None:
        self.driver = "deepspeed"
        try:
            self.ds_config = rankinfo.resolved_ds_config(engine)
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"ds_config: {one_line(exc)}")

    def on_step(self, source: str, obj: Any) -> None:
        if self.broken:
            return
        try:
            if not self._is_clock(source, obj):
                return
            if self.profiler is None and not self.skipped:
                self._begin()
            if self.profiler is not None:
                self.profiler.tick()
        except Exception as exc:  # noqa: BLE001 - give up on this rank's capture, keep training
            self.broken = True
            self.errors.append(one_line(exc))
            self.write_status()

    def _is_clock(self, source: str, obj: Any) -> bool:
        if source == "deepspeed":
            self.driver = "deepspeed"
            return True
        if self.driver == "deepspeed":
            return False  # the engine's inner optimizer: the engine is the clock
        if self._clock is None:
            self.driver, self._clock = "optimizer", id(obj)
        return id(obj) == self._clock

    def _begin(self) -> None:
        self.identity = rankinfo.identity()
        rank = self.identity["rank"]
        os.makedirs(os.path.join(self.settings.out, layout.STATUS_DIR), exist_ok=True)  # a node without it
        if not self.settings.wants(rank):
            self.skipped = True
        else:
            self.profiler = StepProfiler(
                self.settings.out, rank, self.settings.schedule, self.settings.with_stack, self._on_profiler_state
            )
        self.write_status()

    def _on_profiler_state(self, prof: StepProfiler) -> None:
        if prof.state == "ok":
            self._start_summary()
        self.write_status()

    # -- summary --------------------------------------------------------------------------------------

    def _start_summary(self) -> None:
        """Analyze the trace in a separate, low-priority process (never in the training loop)."""
        rank = self.identity["rank"] if self.identity else 0
        out = self.settings.out
        env = dict(os.environ)
        env[ENV_DISABLE] = "1"
        cmd = [
            sys.executable,
            "-m",
            "overlapcheck.capture.summary",
            "--trace",
            layout.trace_path(out, rank),
            "--out",
            layout.summary_path(out, rank),
            "--status",
            layout.summary_status_path(out, rank),
            "--rank-status",
            layout.rank_status_path(out, rank),
        ]
        try:
            with open(layout.summary_log_path(out, rank), "wb") as log:
                proc = subprocess.Popen(
                    cmd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,
                    close_fds=True,
                )
            self.summary = {"status": "pending", "pid": proc.pid, "host": rankinfo.identity()["host"]}
        except Exception as exc:  # noqa: BLE001
            self.summary = {"status": "failed", "error": f"could not start: {one_line(exc)}"}

    # -- status ---------------------------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        ident = dict(self.identity or rankinfo.identity())
        prof = self.profiler
        state = "skipped" if self.skipped else (prof.state if prof else "waiting")
        error = prof.error if prof else None
        if self.broken and state not in ("ok", "failed"):
            state, error = "failed", self.errors[-1]
        capture: dict[str, Any] = {"status": state, "error": error, "steps_seen": prof.steps_done if prof else None}
        if prof is not None:
            capture.update(
                first_step=prof.schedule.first,
                last_step=prof.schedule.last,
                trace_bytes=prof.trace_bytes,
                export_s=prof.export_s,
            )
            if prof.state == "ok":
                capture["trace"] = os.path.basename(layout.trace_path(self.settings.out, ident["rank"]))
        return {
            **ident,
            "driver": self.driver,
            "updated_at": time.time(),
            "versions": rankinfo.versions(),
            "gpu": rankinfo.gpu_name(ident.get("local_rank")),
            "cuda_sync_events": cuda_sync_events_supported(),
            "env": rankinfo.relevant_env(os.environ),
            "ds_config": self.ds_config,
            "capture": capture,
            "summary": self.summary,
            "errors": self.errors,
        }

    def write_status(self) -> None:
        try:
            st = self.status()
            atomic_write_json(layout.rank_status_path(self.settings.out, st["rank"]), st)
        except Exception as exc:  # noqa: BLE001
            print(f"overlapcheck: could not write the rank status: {one_line(exc)}", file=sys.stderr)

    def at_exit(self) -> None:
        """Record how the capture ended if the job stopped before or inside the window."""
        prof = self.profiler
        if prof is None or prof.state in ("ok", "failed"):
            return  # never stepped, skipped, or already final
        if prof.state == "waiting":
            prof.state = "not_reached"
            prof.error = (
                f"the job ran {prof.steps_done} optimizer steps; the window starts at step "
                f"{prof.schedule.wait} and records steps {prof.schedule.first}-{prof.schedule.last}"
            )
        else:
            prof.finish_early()
        self.write_status()
