"""One `overlapcheck run` launch: prepare the run folder, start the job with the capture env, wait for
it and the per-rank summaries, then write run.json. The job's exit status is returned unchanged."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
from typing import Any

from overlapcheck.capture import launchers, layout, manifest, propagation, supervisor
from overlapcheck.capture.atomic import atomic_write_json, read_json
from overlapcheck.capture.rankinfo import relevant_env
from overlapcheck.capture.settings import ENV_NAMES, CaptureSettings
from overlapcheck.errors import UserError


def default_out() -> str:
    return time.strftime("overlapcheck-run-%Y%m%d-%H%M%S")


def prepare_out(out: str, force: bool, join: bool) -> None:
    """Create the run folder. A non-empty one is refused unless `force` (then our files are removed)
    or `join` (a per-node launch for node > 0 joins the folder node 0 uses; it creates nothing in it, so
    that node 0's own check does not depend on which node starts first)."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError("the run folder exists and is not a folder", path=out)
    if join:
        os.makedirs(out, exist_ok=True)
        return
    if os.path.isdir(out) and os.listdir(out):
        if not force:
            raise UserError(
                "the run folder exists and is not empty; use --force to replace its run files, or choose another --out",
                path=out,
            )
        for name in os.listdir(out):
            if layout.is_run_file(name):
                os.unlink(os.path.join(out, name))
        shutil.rmtree(os.path.join(out, layout.STATUS_DIR), ignore_errors=True)
    os.makedirs(os.path.join(out, layout.STATUS_DIR), exist_ok=True)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def wait_for_summaries(out: str, timeout: float, poll: float = 0.2) -> list[int]:
    """Wait until every started summary has finished (or its process is gone); returns ranks still pending."""
    host = socket.gethostname()
    deadline = time.monotonic() + timeout
    while True:
        pending = []
        ranks, summaries, _, _ = manifest.read_statuses(out)
        for rank, status in ranks.items():
            summ = status.get("summary") or {}
            if summ.get("status") != "pending" or rank in summaries:
                continue
            if summ.get("host") == host and summ.get("pid") and not _alive(int(summ["pid"])):
                continue  # died without a word: run.json says "pending" with no file
            pending.append(rank)
        if not pending or time.monotonic() >= deadline:
            return sorted(pending)
        time.sleep(poll)


def run(
    argv: list[str], settings: CaptureSettings, *, force: bool, out_given: bool, summary_timeout: float = 120.0
) -> int:
    """Run the job under capture; returns its exit status (negative: killed by that signal)."""
    plan = launchers.plan(argv, forward=[*ENV_NAMES, "PYTHONPATH"])
    join = plan.per_node and plan.node_rank > 0
    if plan.per_node and not out_given:
        raise UserError(
            "this command is launched once per node: give every node's `overlapcheck run` "
            "the same --out (on a shared file system)"
        )
    if shutil.which(plan.argv[0]) is None:
        raise UserError(f"command not found: {plan.argv[0]}")
    out = os.path.abspath(settings.out)
    try:
        prepare_out(out, force, join)
    except OSError as exc:
        raise UserError(f"cannot prepare the run folder: {exc.strerror or exc}", path=out) from None
    settings_env = CaptureSettings(out, settings.schedule, settings.with_stack, settings.ranks).to_env()
    env = propagation.child_env(os.environ, settings_env)
    ds_env_file = None
    if plan.kind == "deepspeed" and not plan.per_node:  # --no_ssh launches inherit the environment
        ours = {**settings_env, "PYTHONPATH": env["PYTHONPATH"]}
        ds_env_file = propagation.write_ds_env_file(layout.ds_env_file_path(out, plan.node_rank), env, ours)
        env[propagation.DS_ENV_FILE] = ds_env_file
    own = _launcher_status(plan, settings, ds_env_file)
    if not join:
        atomic_write_json(os.path.join(out, layout.RUN_JSON), manifest.merge(out, own))

    code = supervisor.run_child(plan.argv, env)

    try:
        pending = wait_for_summaries(out, summary_timeout)
    except KeyboardInterrupt:  # stop waiting, still write run.json
        pending = []
    own.update(finished_at=manifest.now_iso(), exit_code=code, summaries_unfinished=pending)
    os.makedirs(os.path.join(out, layout.STATUS_DIR), exist_ok=True)
    atomic_write_json(layout.launcher_status_path(out, plan.node_rank), own)
    doc = manifest.merge(out, own)
    atomic_write_json(os.path.join(out, layout.RUN_JSON), doc)
    _tell(out, doc)
    return code


def _launcher_status(plan: launchers.LaunchPlan, settings: CaptureSettings, ds_env_file: str | None) -> dict[str, Any]:
    sch = settings.schedule
    return {
        "node_rank": plan.node_rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "kind": plan.kind,
        "command": plan.argv,
        "cwd": os.getcwd(),
        "per_node": plan.per_node,
        "hostfile": plan.hostfile,
        "ds_env_file": ds_env_file,
        "started_at": manifest.now_iso(),
        "finished_at": None,
        "exit_code": None,
        "profiler": {
            "wait": sch.wait,
            "warmup": sch.warmup,
            "active": sch.active,
            "first_step": sch.first,
            "last_step": sch.last,
            "with_stack": settings.with_stack,
            "record_shapes": True,
            "ranks": settings.ranks,
        },
        "versions": manifest.installed_versions(),
        "env": relevant_env(os.environ),
    }


def _tell(out: str, doc: dict[str, Any]) -> None:
    ok = sum(1 for r in doc["ranks"] if r["capture"].get("trace"))
    failed = [
        f"rank {r['rank']}: {r['capture'].get('error')}"
        for r in doc["ranks"]
        if r["capture"].get("status") not in ("ok", "skipped")
    ]
    world = doc.get("world_size") or len(doc["ranks"])
    print(f"overlapcheck: {ok}/{world} rank traces in {out}; next: overlapcheck report {out}", file=sys.stderr)
    for line in failed[:5]:
        print(f"overlapcheck:   {line}", file=sys.stderr)


def read_run(out: str) -> dict[str, Any] | None:
    """The run.json of a run folder (None when missing)."""
    return read_json(os.path.join(out, layout.RUN_JSON))
