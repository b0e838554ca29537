"""Launcher adapters: recognise the user's launch command and adapt it so every rank gets the capture env.

Supported: `deepspeed` (and `python -m deepspeed.launcher.runner`), `torchrun` (and
`python -m torch.distributed.run|launch`), `srun`, `python ...`, and anything else that passes its
environment to its children. Only `srun --export=...` is rewritten; DeepSpeed's multi-node runner gets
the variables through its env file (see `propagation`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from overlapcheck.errors import UserError

# deepspeed runner options that take a value (deepspeed/launcher/runner.py::parse_args, 0.14-0.19)
_DS_VALUE_OPTS = {
    "-H",
    "--hostfile",
    "-i",
    "--include",
    "-e",
    "--exclude",
    "--num_nodes",
    "--min_elastic_nodes",
    "--max_elastic_nodes",
    "--num_gpus",
    "--num_accelerators",
    "--master_port",
    "--master_addr",
    "--node_rank",
    "--launcher",
    "--launcher_args",
    "--ssh_port",
    "--elastic_training_config",
    "--enable_each_rank_log",
    "--bind_core_list",
    "--log_level",
    "--comment",
    "--account",
    "--venv_script",
    "--autotuning",
    "--save_pid_file",
}
# torchrun options that take a value (torch/distributed/run.py::get_args_parser), both spellings
_TORCHRUN_VALUE_OPTS = {
    "--nnodes",
    "--nproc_per_node",
    "--nproc-per-node",
    "--rdzv_backend",
    "--rdzv-backend",
    "--rdzv_endpoint",
    "--rdzv-endpoint",
    "--rdzv_id",
    "--rdzv-id",
    "--rdzv_conf",
    "--rdzv-conf",
    "--max_restarts",
    "--max-restarts",
    "--monitor_interval",
    "--monitor-interval",
    "--start_method",
    "--start-method",
    "--role",
    "--node_rank",
    "--node-rank",
    "--master_addr",
    "--master-addr",
    "--master_port",
    "--master-port",
    "--local_addr",
    "--local-addr",
    "--log_dir",
    "--log-dir",
    "-r",
    "--redirects",
    "-t",
    "--tee",
    "--local_ranks_filter",
    "--local-ranks-filter",
    "--logs_specs",
    "--logs-specs",
    "--numa_binding",
    "--numa-binding",
    "--event_log_handler",
    "--event-log-handler",
    "--signals_to_handle",
    "--signals-to-handle",
    "--virtual_local_rank",
    "--virtual-local-rank",
    "--duplicate_stdout_filters",
    "--duplicate-stdout-filters",
    "--duplicate_stderr_filters",
    "--duplicate-stderr-filters",
}
# srun options that take a value (srun(1), Slurm 20-24); short ones may also be written -N4, long ones --opt=value
_SRUN_VALUE_OPTS = {
    *("-A", "-b", "-B", "-c", "-C", "-d", "-D", "-e", "-G", "-i", "-J", "-L", "-m", "-M", "-n", "-N", "-o", "-p"),
    *("-q", "-r", "-S", "-t", "-T", "-w", "-W", "-x"),
    *("--account", "--acctg-freq", "--begin", "--bb", "--bbf", "--chdir", "--cluster-constraint", "--clusters"),
    *("--comment", "--constraint", "--container", "--container-id", "--core-spec", "--cores-per-socket"),
    *("--cpu-bind", "--cpu-freq", "--cpus-per-gpu", "--cpus-per-task", "--deadline", "--delay-boot"),
    *("--dependency", "--distribution", "--epilog", "--error", "--exclude", "--export", "--extra-node-info"),
    *("--gid", "--gpu-bind", "--gpu-freq", "--gpus", "--gpus-per-node", "--gpus-per-socket", "--gpus-per-task"),
    *("--gres", "--gres-flags", "--het-group", "--hint", "--input", "--job-name", "--jobid", "--licenses"),
    *("--mail-type", "--mail-user", "--mcs-label", "--mem", "--mem-bind", "--mem-per-cpu", "--mem-per-gpu"),
    *("--mincpus", "--mpi", "--network", "--nodefile", "--nodelist", "--nodes", "--ntasks", "--ntasks-per-core"),
    *("--ntasks-per-gpu", "--ntasks-per-node", "--ntasks-per-socket", "--open-mode", "--output", "--partition"),
    *("--power", "--prefer", "--prolog", "--qos", "--relative", "--reservation", "--segment", "--signal"),
    *("--slurmd-debug", "--sockets-per-node", "--switches", "--task-epilog", "--task-prolog", "--thread-spec"),
    *("--threads", "--threads-per-core", "--time", "--time-min", "--tmp", "--tres-bind", "--tres-per-task"),
    *("--uid", "--wait", "--wckey"),
}
_DS_MODULES = {"deepspeed.launcher.runner"}
_TORCHRUN_MODULES = {"torch.distributed.run", "torch.distributed.launch"}


@dataclass(frozen=True)
class LaunchPlan:
    """What `overlapcheck run` needs to know about the user's command."""

    kind: str  # "deepspeed" | "torchrun" | "srun" | "python" | "other"
    argv: list[str]  # the command to run (only srun's --export may be rewritten)
    node_rank: int = 0  # this launch's node when every node is launched separately
    per_node: bool = False  # True: one `overlapcheck run` per node (--no_ssh, torchrun --nnodes>1)
    hostfile: str | None = None  # deepspeed: the hostfile it will read, when it exists
    inner: str | None = None  # srun: the kind of the program it starts on every task (deepspeed, torchrun, ...)


def plan(argv: list[str], forward: list[str]) -> LaunchPlan:
    """Recognise `argv`; `forward` names the env variables every rank needs (for srun --export)."""
    if not argv:
        raise UserError("no command given: use `overlapcheck run [OPTIONS] -- <your launch command>`")
    exe = os.path.basename(argv[0])
    module, rest = _python_module(argv)
    if exe == "deepspeed" or module in _DS_MODULES:
        return _deepspeed(argv, argv[1:] if module is None else rest)
    if exe == "torchrun" or module in _TORCHRUN_MODULES:
        return _torchrun(argv, argv[1:] if module is None else rest)
    if exe == "srun":
        program = _srun_program(argv)
        inner = kind_of(argv[program:]) if program < len(argv) else None
        return LaunchPlan("srun", _srun_export(argv, forward), inner=inner)
    if exe.startswith("python"):
        return LaunchPlan("python", list(argv))
    return LaunchPlan("other", list(argv))


def kind_of(argv: list[str]) -> str:
    """What kind of launch `argv` is, without checking its options: deepspeed, torchrun, srun, python, other."""
    exe = os.path.basename(argv[0])
    module, _ = _python_module(argv)
    if exe == "deepspeed" or module in _DS_MODULES:
        return "deepspeed"
    if exe == "torchrun" or module in _TORCHRUN_MODULES:
        return "torchrun"
    if exe == "srun":
        return "srun"
    return "python" if exe.startswith("python") else "other"


def _python_module(argv: list[str]) -> tuple[str | None, list[str]]:
    """For `python [-u ...] -m MODULE args`, return (MODULE, args)."""
    if not os.path.basename(argv[0]).startswith("python"):
        return None, []
    for i, tok in enumerate(argv[1:], start=1):
        if tok == "-m" and i + 1 < len(argv):
            return argv[i + 1], argv[i + 2 :]
        if not tok.startswith("-"):
            break
    return None, []


def launcher_options(args: list[str], value_opts: set[str]) -> dict[str, str]:
    """The launcher's own options (before the script): {"--opt": "value" or "" for flags}."""
    found: dict[str, str] = {}
    i = 0
    while i < len(args):
        tok = args[i]
        if not tok.startswith("-") or tok == "--":
            break
        name, eq, value = tok.partition("=")
        if not eq and name in value_opts and i + 1 < len(args):
            value = args[i + 1]
            i += 1
        found[name] = value
        i += 1
    return found


def _deepspeed(argv: list[str], args: list[str]) -> LaunchPlan:
    opts = launcher_options(args, _DS_VALUE_OPTS)
    hostfile = opts.get("--hostfile", opts.get("-H", "/job/hostfile"))
    per_node = "--no_ssh" in opts
    node_rank = _int_opt(opts, "--node_rank", 0) if per_node else 0
    return LaunchPlan(
        "deepspeed",
        list(argv),
        node_rank=node_rank,
        per_node=per_node,
        hostfile=hostfile if os.path.isfile(hostfile) else None,
    )


def _torchrun(argv: list[str], args: list[str]) -> LaunchPlan:
    opts = launcher_options(args, _TORCHRUN_VALUE_OPTS)
    nnodes = opts.get("--nnodes", "1")
    per_node = nnodes.split(":")[-1] not in ("1", "")
    node_rank = _int_opt(opts, "--node_rank", _int_opt(opts, "--node-rank", -1))
    if node_rank < 0:  # elastic rendezvous assigns node ranks itself; use the scheduler's node id
        node_id = os.environ.get("NODE_RANK", os.environ.get("SLURM_NODEID", os.environ.get("GROUP_RANK")))
        node_rank = int(node_id) if node_id and node_id.isdigit() else (-1 if per_node else 0)
    if node_rank < 0:
        raise UserError(
            "torchrun --nnodes > 1 without --node_rank: give each node's launch its --node_rank "
            "(or set NODE_RANK) so that the nodes' files in the run folder do not collide"
        )
    return LaunchPlan("torchrun", list(argv), node_rank=node_rank, per_node=per_node)


def _srun_program(argv: list[str]) -> int:
    """The index in `argv` (an srun command) of the program srun runs: the first word that is neither one of
    srun's options nor an option's value."""
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return i + 1
        if not tok.startswith("-") or tok == "-":
            return i
        i += 2 if tok in _SRUN_VALUE_OPTS else 1
    return len(argv)


def _srun_export(argv: list[str], forward: list[str]) -> list[str]:
    """srun forwards the whole environment unless --export limits it: then add our variables' names."""
    out = list(argv)
    program = _srun_program(argv)
    for i in range(1, program):
        tok = out[i]
        if tok == "--export" and i + 1 < program:
            out[i + 1] = _export_value(out[i + 1], forward)
            break
        if tok.startswith("--export="):
            out[i] = "--export=" + _export_value(tok.split("=", 1)[1], forward)
            break
    return out


def _export_value(value: str, forward: list[str]) -> str:
    items = [v for v in value.split(",") if v]
    if any(v.upper() == "ALL" for v in items):
        return value
    if len(items) == 1 and items[0].upper() in ("NONE", "NIL"):
        items = []  # NONE cannot be combined with names; a name list still excludes everything else
    names = {v.split("=", 1)[0] for v in items}
    return ",".join(items + [n for n in forward if n not in names])


def _int_opt(opts: dict[str, str], name: str, default: int) -> int:
    if name not in opts:
        return default
    try:
        return int(opts[name])
    except ValueError:
        raise UserError(f"{name} must be an integer, got {opts[name]!r}") from None
