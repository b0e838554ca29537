"""One rank's capture: picks the step clock, runs the profiler, writes its status file, starts its summary.

The status file `status/rank<R>.json` is written only by this rank (atomically); the launcher merges all
of them into run.json. Every method here swallows its own errors: capture must never stop the job.

Only the process that joined the job as rank R captures rank R. A helper process that inherits `RANK` and
steps an optimizer of its own (or a forked copy of the rank) would otherwise overwrite the rank's trace,
status and summary. So the first process to reach a step claims the rank in `status/rank<R>.owner`
(created exclusively); a later one does nothing, unless it has torch.distributed initialized and the owner
had not (it joined the job; the owner was a helper), or the owner is a dead process on this host (a torchrun
restart). An owner that lost its claim stops at its next write.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from typing import Any

from overlapcheck.capture import layout, rankinfo
from overlapcheck.capture.atomic import atomic_write_json, create_json, read_json
from overlapcheck.capture.profiler import StepProfiler, cuda_sync_events_supported, one_line
from overlapcheck.capture.settings import ENV_DISABLE, CaptureSettings
from overlapcheck.capture.supervisor import process_alive


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
        self.pid = os.getpid()  # a forked copy of this object in a child process does nothing
        self.helper = False  # another process captures this rank: this one does nothing
        self._claim: dict[str, Any] | None = None

    # -- events from the hooks ------------------------------------------------------------------------

    def on_engine(self, engine: Any) -> None:
        self.driver = "deepspeed"
        try:
            self.ds_config = rankinfo.resolved_ds_config(engine)
        except Exception as exc:  # noqa: BLE001
            self.errors.append(f"ds_config: {one_line(exc)}")
        try:
            from overlapcheck.capture.modules import annotate

            annotate(engine)
        except Exception as exc:  # noqa: BLE001 - the annotations are an extra; the job goes on without them
            self.errors.append(f"module annotations: {one_line(exc)}")

    def on_step(self, source: str, obj: Any) -> None:
        if self.broken or self.helper or os.getpid() != self.pid:
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
        os.makedirs(layout.traces_dir(self.settings.out), exist_ok=True)
        if not self._take_rank(rank):
            self.helper = True
            return
        if not self.settings.wants(rank):
            self.skipped = True
        else:
            self.profiler = StepProfiler(
                self.settings.out,
                rank,
                self.settings.schedule,
                self.settings.with_stack,
                self._on_profiler_state,
                may_write=self._owns,
                with_modules=self.settings.with_modules,
            )
        self.write_status()

    # -- who captures this rank ---------------------------------------------------------------------

    def _take_rank(self, rank: int) -> bool:
        """Claim rank `rank` for this process; False when another process captures it."""
        assert self.identity is not None
        me = {
            "pid": self.pid,
            "host": self.identity["host"],
            "joined": self.identity.get("backend") is not None,  # torch.distributed initialized here
        }
        path = layout.rank_owner_path(self.settings.out, rank)
        if create_json(path, me):
            self._claim = me
            return True
        owner = read_json(path) or {}
        same_host = owner.get("host") == me["host"]
        dead = same_host and isinstance(owner.get("pid"), int) and not process_alive(owner["pid"])
        if dead or (me["joined"] and not owner.get("joined")):
            atomic_write_json(path, me)
            self._claim = me
            if not dead:  # the owner was a helper: what it wrote for this rank is not the rank's
                for stale in (layout.trace_path(self.settings.out, rank), layout.summary_path(self.settings.out, rank)):
                    with contextlib.suppress(OSError):
                        os.unlink(stale)
            return True
        print(
            f"overlapcheck: process {self.pid} also steps an optimizer as rank {rank}; process "
            f"{owner.get('pid')} on {owner.get('host')} captures rank {rank}, so this one does not",
            file=sys.stderr,
        )
        return False

    def _owns(self) -> bool:
        """Whether this process still holds its rank's claim (checked before each write, a few per run)."""
        if self._claim is None or self.identity is None:
            return True  # no claim taken (not begun): nothing to protect
        owner = read_json(layout.rank_owner_path(self.settings.out, self.identity["rank"]))
        if owner is None or (owner.get("pid") == self._claim["pid"] and owner.get("host") == self._claim["host"]):
            return True
        self.helper = True  # lost the rank to the process that joined the job as it
        prof, self.profiler = self.profiler, None
        if prof is not None and prof._prof is not None:
            with contextlib.suppress(Exception):
                prof._prof.stop()
        return False

    def _on_profiler_state(self, prof: StepProfiler) -> None:
        if prof.state == "ok":
            self._start_summary()
        self.write_status()

    # -- summary --------------------------------------------------------------------------------------

    def _start_summary(self) -> None:
        """Analyze the trace in a separate, low-priority process (never in the training loop)."""
        if not self._owns():
            return
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
            captured = prof.steps_captured
            capture.update(
                first_step=prof.schedule.first,
                last_step=prof.schedule.last,
                trace_bytes=prof.trace_bytes,
                export_s=prof.export_s,
                # the steps whole in the trace, and whether that is the whole window (report says what is missing)
                steps_captured={"first": captured[0], "last": captured[1]} if captured else None,
                complete=prof.complete,
            )
            if prof.state == "ok":
                capture["trace"] = os.path.relpath(
                    layout.trace_path(self.settings.out, ident["rank"]), self.settings.out
                )
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
        if self.helper or not self._owns():
            return
        try:
            st = self.status()
            atomic_write_json(layout.rank_status_path(self.settings.out, st["rank"]), st)
        except Exception as exc:  # noqa: BLE001
            print(f"overlapcheck: could not write the rank status: {one_line(exc)}", file=sys.stderr)

    def at_exit(self) -> None:
        """Record how the capture ended if the job stopped before or inside the window."""
        if os.getpid() != self.pid or self.helper:
            return  # a forked child's copy, or not this rank's capture
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
