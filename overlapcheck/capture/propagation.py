"""How the capture settings reach every rank.

- Local ranks (torchrun, deepspeed on one node or with --no_ssh, python, srun) inherit the environment
  of `overlapcheck run`: the settings variables plus PYTHONPATH with the bootstrap folder first.
- DeepSpeed's multi-node runner (pdsh, ssh, openmpi, mpich, impi, mvapich, slurm backends) exports only
  variables whose names start with MLFLOW, PYTHON, MV2, UCX (plus the accelerator's, e.g. NCCL) and those
  listed in its env file: `$DS_ENV_FILE` (default `.deepspeed_env`), read from the home folder and then
  the current folder (deepspeed/launcher/runner.py::main). We never edit the user's files: we write a
  merged copy (the user's lines, then ours) into the run folder and point DS_ENV_FILE at it for this
  launch only. An absolute DS_ENV_FILE wins over both folders in the runner's os.path.join.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from overlapcheck.capture.atomic import atomic_write_bytes

BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
DS_ENV_FILE = "DS_ENV_FILE"
DS_ENV_DEFAULT = ".deepspeed_env"


def with_bootstrap(pythonpath: str | None) -> str:
    """PYTHONPATH with the bootstrap folder first (once)."""
    parts = [p for p in (pythonpath or "").split(os.pathsep) if p and p != BOOTSTRAP_DIR]
    return os.pathsep.join([BOOTSTRAP_DIR, *parts])


def child_env(base: Mapping[str, str], settings_env: Mapping[str, str]) -> dict[str, str]:
    """The environment for the launch command: `base` plus the settings and the bootstrap path."""
    env = dict(base)
    env.update(settings_env)
    env["PYTHONPATH"] = with_bootstrap(base.get("PYTHONPATH"))
    return env


def user_ds_env_files(env: Mapping[str, str], cwd: str, home: str) -> list[str]:
    """The env files the DeepSpeed runner would read, in its order (home, then current folder)."""
    name = env.get(DS_ENV_FILE, DS_ENV_DEFAULT)
    found: list[str] = []
    for folder in (home, cwd):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and os.path.realpath(path) not in [os.path.realpath(p) for p in found]:
            found.append(path)
    return found


def parse_ds_env_file(text: str) -> list[tuple[str, str]]:
    """KEY=VALUE lines as DeepSpeed reads them (split at the first '='; lines without one are skipped)."""
    pairs = []
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip():
            pairs.append((key.strip(), value.strip()))
    return pairs


def merged_ds_env(user_files: list[str], ours: Mapping[str, str], cwd: str) -> str:
    """The user's env-file entries, then ours. PYTHONPATH keeps the user's entries after the bootstrap
    and the launch folder first, as the runner itself does for the exported PYTHONPATH."""
    entries: dict[str, str] = {}
    for path in user_files:
        with open(path, encoding="utf-8") as fh:
            entries.update(parse_ds_env_file(fh.read()))
    for key, value in ours.items():
        if key == "PYTHONPATH":
            value = os.pathsep.join([cwd, with_bootstrap(entries.get("PYTHONPATH") or value)])
        entries[key] = value
    return "".join(f"{k}={v}\n" for k, v in entries.items())


def write_ds_env_file(
    path: str, env: Mapping[str, str], ours: Mapping[str, str], cwd: str | None = None, home: str | None = None
) -> str:
    """Write the merged env file to `path`; returns it (set DS_ENV_FILE to it in the launch env)."""
    cwd = cwd or os.getcwd()
    home = home or os.path.expanduser("~")
    text = merged_ds_env(user_ds_env_files(env, cwd, home), ours, cwd)
    atomic_write_bytes(path, text.encode())
    return path
