"""One `overlapcheck run` launch: prepare the run folder, start the job with the capture env, wait for
it and the per-rank summaries, then write run.json. The job's exit status is returned unchanged."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from overlapcheck.capture import launchers, layout, manifest, propagation, supervisor
from overlapcheck.capture.atomic import atomic_write_json, read_json
from overlapcheck.capture.rankinfo import relevant_env
from overlapcheck.capture.settings import ENV_NAMES, CaptureSettings
from overlapcheck.errors import UserError
from overlapcheck.report.present import safe_path


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
        _only_an_earlier_run(out)
        owned = [
            *_own_files(os.path.join(out, layout.STATUS_DIR), layout.is_own_status),
            *_own_files(layout.traces_dir(out), layout.is_own_trace),
        ]  # checked before anything is deleted: a refusal leaves the folder as it was
        for name in os.listdir(out):
            if layout.is_run_file(name) and not os.path.isdir(os.path.join(out, name)):
                os.unlink(os.path.join(out, name))
        for path in owned:
            os.unlink(path)
    os.makedirs(os.path.join(out, layout.STATUS_DIR), exist_ok=True)
    os.makedirs(layout.traces_dir(out), exist_ok=True)


def _own_files(folder: str, own: Callable[[str], bool]) -> list[str]:
    """The files of `folder` (traces/ or status/ of an earlier run) that --force deletes: only those
    `overlapcheck run` writes. A folder that is a symbolic link (the run would write through it into another
    folder) or that holds anything else (notes, another job's traces, subfolders) is refused: never deleted,
    even with --force, and never mixed with the new run's files."""
    if not os.path.lexists(folder):
        return []
    if os.path.islink(folder) or not os.path.isdir(folder):
        kind = "a symbolic link" if os.path.islink(folder) else "not a folder"
        raise UserError(
            f"is {kind}; overlapcheck run writes only into folders of its own, never replaced, even with "
            "--force: choose an empty or new --out",
            path=folder,
        )
    names = sorted(os.listdir(folder))
    foreign = [
        n
        for n in names
        if not own(n) or not os.path.isfile(os.path.join(folder, n)) or os.path.islink(os.path.join(folder, n))
    ]
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise UserError(
            f"holds files that no `overlapcheck run` wrote ({shown}), never deleted, even with --force: "
            "move them or choose an empty or new --out",
            path=folder,
        )
    return [os.path.join(folder, n) for n in names]


def _only_an_earlier_run(out: str) -> None:
    """UserError unless the non-empty folder `out` holds an earlier `overlapcheck run`, whose run files --force
    may replace: its run.json is this tool's (written before the job starts). A folder of traces, summaries or
    anything else is never emptied, even with --force: --force deletes the traces in traces/ and the summaries."""
    from overlapcheck.fsutil import read_json_file

    try:
        doc = read_json_file(os.path.join(out, layout.RUN_JSON), "a run manifest")  # regular files only: no FIFO
    except UserError:
        doc = None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not (isinstance(schema, str) and schema.startswith(manifest.SCHEMA.rsplit("/", 1)[0] + "/")):
        raise UserError(
            "holds files that no `overlapcheck run` wrote (no run.json of overlapcheck run there), never "
            "replaced, even with --force: choose an empty or new --out",
            path=out,
        )


def _alive(pid: int) -> bool:
    return supervisor.process_alive(pid)


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
    hint = slurm_hint(plan, os.environ)
    if hint:
        print(f"overlapcheck: note: {hint}", file=sys.stderr)
    out = os.path.abspath(settings.out)
    try:
        prepare_out(out, force, join)
    except OSError as exc:
        raise UserError(f"cannot prepare the run folder: {exc.strerror or exc}", path=out) from None
    settings_env = CaptureSettings(
        out, settings.schedule, settings.with_stack, settings.ranks, settings.with_modules
    ).to_env()
    env = propagation.child_env(os.environ, settings_env)
    ds_env_file = None
    if plan.kind == "deepspeed" and not plan.per_node:  # --no_ssh launches inherit the environment
        ours = {**settings_env, "PYTHONPATH": env["PYTHONPATH"]}
        ds_env_file = propagation.write_ds_env_file(layout.ds_env_file_path(out, plan.node_rank), env, ours)
        env[propagation.DS_ENV_FILE] = ds_env_file
    own = _launcher_status(plan, settings, ds_env_file)
    if not join:
        try:
            atomic_write_json(os.path.join(out, layout.RUN_JSON), manifest.merge(out, own))
        except OSError as exc:
            raise UserError(f"cannot write run.json: {exc.strerror or exc}", path=out) from None

    code = supervisor.run_child(plan.argv, env)

    # from here on nothing changes the exit status: it is the job's
    try:
        pending = wait_for_summaries(out, summary_timeout)
    except KeyboardInterrupt:  # stop waiting, still write run.json
        pending = []
    except Exception:  # noqa: BLE001 - nor does a summary that cannot be waited for
        pending = []
    try:
        remove_stale_exports(out)
        own.update(finished_at=manifest.now_iso(), exit_code=code, summaries_unfinished=pending)
        os.makedirs(os.path.join(out, layout.STATUS_DIR), exist_ok=True)
        atomic_write_json(layout.launcher_status_path(out, plan.node_rank), own)
        doc = manifest.merge(out, own)
        doc["notes"] = capture_notes(doc, plan, os.environ, code)
        atomic_write_json(os.path.join(out, layout.RUN_JSON), doc)
    except Exception as exc:  # noqa: BLE001 - a manifest failure must never change the job's exit status
        print(f"overlapcheck: could not write the run manifest: {exc}", file=sys.stderr)
        return code
    with contextlib.suppress(Exception):  # the closing lines only repeat run.json's notes
        _tell(out, doc)
    return code


def remove_stale_exports(out: str) -> list[str]:
    """Remove the temp files of exports killed midway (`.rank<R>.<host>.<pid>.tmp.gz`) whose process, on this
    host, is gone; those of other hosts (a shared run folder) are left to their own launcher. Returns them."""
    host = socket.gethostname()
    removed = []
    folder = layout.traces_dir(out)
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        m = layout.TRACE_TMP.match(name)
        if m and m.group(2) == host and not _alive(int(m.group(3))):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
                removed.append(name)
    return removed


_RANK_VARS = ("RANK", "WORLD_SIZE")


def slurm_hint(plan: launchers.LaunchPlan, env: Mapping[str, str]) -> str | None:
    """What to say when Slurm starts the ranks but nothing gives them RANK / WORLD_SIZE."""
    if any(v in env for v in _RANK_VARS) or any("RANK=" in tok for tok in plan.argv):
        return None
    srun_python = plan.kind == "srun" and plan.inner not in ("torchrun", "deepspeed", None)
    inside_srun = plan.kind == "python" and env.get("SLURM_PROCID") is not None and env.get("SLURM_NTASKS", "1") != "1"
    if not (srun_python or inside_srun):
        return None
    return (
        "Slurm starts these tasks, but DeepSpeed's init_distributed (like torch's env:// rendezvous) reads RANK, "
        "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT, not SLURM_PROCID / SLURM_NTASKS: unless the script "
        "sets them, the job fails or every task runs as rank 0 of its own job. Run torchrun under srun "
        "(srun ... torchrun --nnodes N --nproc_per_node G ...), or set them from the SLURM_* variables "
        "(docs/capture.md, Slurm)"
    )


def capture_notes(doc: dict[str, Any], plan: launchers.LaunchPlan, env: Mapping[str, str], code: int) -> list[str]:
    """What run.json `notes` says about the capture: why nothing was captured, which ranks are incomplete."""
    notes: list[str] = []
    if not doc["ranks"]:
        notes.extend(_why_nothing(code))
    else:
        incomplete = [r for r in doc["ranks"] if r["rank"] in set(doc.get("incomplete_ranks") or [])]
        if incomplete:
            notes.append(
                f"capture incomplete on {len(incomplete)} of {len(doc['ranks'])} ranks: "
                + "; ".join(f"rank {r['rank']}: {_capture_state(r['capture'])}" for r in incomplete[:8])
                + (f"; and {len(incomplete) - 8} more" if len(incomplete) > 8 else "")
            )
        if doc.get("missing_ranks"):
            missing = doc["missing_ranks"]
            notes.append(
                f"{len(missing)} ranks below world_size wrote no status (never reached an optimizer step under the "
                f"capture, or their node's files are elsewhere): {_short_list(missing)}"
            )
    hint = slurm_hint(plan, env)
    if hint:
        notes.append(hint)
    return notes


def _capture_state(capture: dict[str, Any]) -> str:
    error = capture.get("error")
    return f"{capture.get('status')}: {error}" if error else str(capture.get("status"))


def _short_list(ranks: list[int], most: int = 16) -> str:
    shown = ", ".join(str(r) for r in ranks[:most])
    return shown + (f", ... ({len(ranks)} in all)" if len(ranks) > most else "")


def _why_nothing(code: int) -> list[str]:
    """Why no rank wrote a status, with what to do; the likeliest first."""
    why = ["no process of the job reached an optimizer step under the capture, so no rank was captured"]
    if code > 0:
        why.append(f"the job failed (exit code {code}) before any rank finished an optimizer step: its output says why")
    elif code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        why.append(f"the job was killed ({name}) before any rank finished an optimizer step")
    if importlib.util.find_spec("torch") is None:
        why.append(
            f"torch is not importable by {sys.executable}: the capture runs inside the job's Python, which needs "
            "torch (pip install 'overlapcheck[capture]' into the job's environment)"
        )
    why.append(
        "a rank is captured from its first optimizer step (a torch.optim optimizer or a DeepSpeed engine): a job "
        "that never steps one (inference, evaluation) is not captured, and a Python started with -I, -E or -S, or "
        "a launcher that replaces PYTHONPATH, never loads the capture (docs/capture.md, Limits)"
    )
    return why


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
            "with_stack": settings.with_stack or settings.with_modules,
            "with_modules": settings.with_modules,
            "record_shapes": True,
            "ranks": settings.ranks,
        },
        "versions": manifest.installed_versions(),
        "env": relevant_env(os.environ),
    }


def _tell(out: str, doc: dict[str, Any]) -> None:
    """The closing lines on stderr: how many traces, and what went wrong (run.json `notes` says it too)."""
    notes = list(doc.get("notes") or [])
    if not doc["ranks"]:
        why = notes[0] if notes else "nothing was captured"
        print(f"overlapcheck: no rank traces in {safe_path(out)}: {why}", file=sys.stderr)
        for line in notes[1:]:
            print(f"overlapcheck:   {line}", file=sys.stderr)
        return
    ok = sum(1 for r in doc["ranks"] if r["capture"].get("trace"))
    failed = [
        f"rank {r['rank']}: {_what_went_wrong(r['capture'])}"
        for r in doc["ranks"]
        if r["capture"].get("status") not in ("ok", "skipped") or not r["capture"].get("complete", True)
    ]
    world = doc.get("world_size") or len(doc["ranks"])
    shown = safe_path(out)
    print(f"overlapcheck: {ok}/{world} rank traces in {shown}; next: overlapcheck report {shown}", file=sys.stderr)
    incomplete = doc.get("incomplete_ranks") or []
    if incomplete:
        print(
            f"overlapcheck: capture incomplete on {len(incomplete)} ranks ({_short_list(incomplete)}); "
            "run.json says which steps each has:",
            file=sys.stderr,
        )
    for line in failed[:5]:
        print(f"overlapcheck:   {line}", file=sys.stderr)
    if len(failed) > 5:
        print(f"overlapcheck:   ... and {len(failed) - 5} more ranks (run.json)", file=sys.stderr)
    for note in notes:
        if not note.startswith("capture incomplete"):
            print(f"overlapcheck: note: {note}", file=sys.stderr)


def read_run(out: str) -> dict[str, Any] | None:
    """The run.json of a run folder (None when missing)."""
    return read_json(os.path.join(out, layout.RUN_JSON))


def _what_went_wrong(capture: dict[str, Any]) -> str:
    """A rank's line of `_tell`: its error, else which steps of the window its trace holds (a capture that ended
    early has no error: it printed "rank 1: None")."""
    if capture.get("error"):
        return str(capture["error"])
    window = f"{capture.get('first_step')}..{capture.get('last_step')}"
    got = capture.get("steps_captured")
    if isinstance(got, dict):
        return f"incomplete: its trace holds steps {got.get('first')}..{got.get('last')} of the window {window}"
    if capture.get("status") == "ok":
        return f"incomplete: its trace holds no whole step of the window {window}"
    return f"capture {capture.get('status') or 'not started'}, no error recorded"
