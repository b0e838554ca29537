"""How torch.distributed (ProcessGroupNCCL) launches one collective, as the profiler records it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from overlapcheck.simulate.config import SimConfig
from overlapcheck.simulate.engine import Collective, GpuOp
from overlapcheck.simulate.hardware import GPUS, collective_us, jitter
from overlapcheck.simulate.host import Host
from overlapcheck.simulate.kernels import launch_args, nccl_kernel_name

# collective -> (c10d op, record_param_comms "Collective name", PGNCCL profiling title)
C10D = {
    "all_gather": ("c10d::_allgather_base_", "_allgather_base", "nccl:_all_gather_base"),
    "reduce_scatter": ("c10d::_reduce_scatter_base_", "_reduce_scatter_base", "nccl:_reduce_scatter_base"),
    "all_reduce": ("c10d::allreduce_", "allreduce", "nccl:all_reduce"),
}
DTYPE_NAME = {"bf16": "BFloat16", "fp32": "Float"}
DTYPE_BYTES = {"bf16": 2, "fp32": 4}


@dataclass(frozen=True)
class ProcessGroup:
    name: str
    desc: str
    ranks: tuple[int, ...]
    stream: int  # the PG's internal NCCL stream on every rank

    def config_entry(self) -> dict[str, Any]:
        return {
            "pg_name": self.name,
            "pg_desc": self.desc,
            "backend_config": "cuda:nccl",
            "pg_size": len(self.ranks),
            "ranks": list(self.ranks),
        }


class Fabric:
    """The collectives of the whole job, matched across ranks by (process group, sequence number)."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.gpu = GPUS[cfg.gpu]
        self.calls: dict[tuple[str, int], Collective] = {}

    def collective(self, pg: ProcessGroup, seq: int, kind: str, total_bytes: float) -> Collective:
        key = (pg.name, seq)
        if key not in self.calls:
            nodes = len({r // self.cfg.gpus_per_node for r in pg.ranks})
            us = collective_us(self.gpu, kind, total_bytes, len(pg.ranks), nodes, self.cfg.comm_slowdown)
            if kind in self.cfg.free_collectives:
                us = 0.0
            self.calls[key] = Collective(
                pg.name,
                seq,
                kind,
                len(pg.ranks),
                us * jitter(self.cfg.seed, "coll", pg.name, seq, spread=0.04),
                nbytes=total_bytes,
            )
        coll = self.calls[key]
        if coll.kind != kind:
            raise RuntimeError(f"ranks disagree on collective {key}: {coll.kind} vs {kind}")
        return coll


def comm_args(
    cfg: SimConfig, pg: ProcessGroup, kind: str, in_n: int, out_n: int, dtype: str, rank: int, seq: int
) -> dict[str, Any]:
    """record_param_comms args; key names follow the kineto version of this torch (knowledge doc §4)."""
    nelems = "nelems" if cfg.torch_at_least("2.3") else "size"
    args: dict[str, Any] = {
        "Collective name": C10D[kind][1],
        "dtype": DTYPE_NAME[dtype],
        f"In msg {nelems}": in_n,
        f"Out msg {nelems}": out_n,
        "In split size": "[]",
        "Out split size": "[]",
        "Group size": len(pg.ranks),
    }
    if cfg.torch_at_least("2.4"):
        args.update({"Process Group Name": pg.name, "Process Group Description": pg.desc})
    else:
        args["Process Group ID"] = pg.name
    args.update({"Process Group Ranks": str(list(pg.ranks)), "Global rank start": pg.ranks[0], "Global rank stride": 1})
    if cfg.torch_at_least("2.6"):
        args.update({"Rank": rank, "Seq": seq, "Is asynchronized op": kind == "all_gather"})
    return args


def kernel_comm_args(args: dict[str, Any]) -> dict[str, Any]:
    """The collective args kineto copies onto the NCCL kernel (torch >= 2.2, kineto #821)."""
    keep = (
        "Collective name",
        "In msg nelems",
        "Out msg nelems",
        "In msg size",
        "Out msg size",
        "Group size",
        "dtype",
        "In split size",
        "Out split size",
        "Process Group Name",
        "Process Group Description",
        "Process Group ID",
        "Process Group Ranks",
    )
    return {k: args[k] for k in keep if k in args}


def launch_collective(
    host: Host,
    fabric: Fabric,
    pg: ProcessGroup,
    seq: int,
    kind: str,
    numel: int,
    dtype: str,
    current_stream: int,
    async_op: bool,
) -> GpuOp:
    """c10d op -> record_param_comms -> (stream switch) -> nccl:* annotation -> NCCL kernel (-> wait).

    Synchronous collectives (async_op=False) run on the caller's stream from torch 2.8 on (pytorch
    #148590/#150398); before that, and for async ones, on the process group's NCCL stream, with the
    caller's stream made to wait for the kernel when the op is synchronous.
    """
    cfg = fabric.cfg
    n = len(pg.ranks)
    total = numel if kind == "all_reduce" else (numel * n if kind == "all_gather" else numel)
    in_n, out_n = {
        "all_gather": (numel, numel * n),
        "reduce_scatter": (numel, numel // n),
        "all_reduce": (numel, numel),
    }[kind]
    coll = fabric.collective(pg, seq, kind, total * DTYPE_BYTES[dtype])
    on_caller = not async_op and cfg.torch_at_least("2.8")
    stream = current_stream if on_caller else pg.stream
    op_name, _, title = C10D[kind]
    args = comm_args(cfg, pg, kind, in_n, out_n, dtype, host.rank, seq)
    kargs = launch_args("nccl", GPUS[cfg.gpu].sms)
    if cfg.torch_at_least("2.2"):
        kargs.update(kernel_comm_args(args))
    with host.cpu_op(op_name, cost=6.0), host.cpu_op("record_param_comms", args, cost=4.0):
        if stream != current_stream:
            host.wait_stream(stream, current_stream)
        with host.annotation(title):
            # NCCL 2.17.1 launches with cudaLaunchKernelExC (nccl_data trace); older builds are assumed not to
            runtime = "cudaLaunchKernelExC" if cfg.nccl_at_least("2.17") else "cudaLaunchKernel"
            op = host.launch(
                nccl_kernel_name(cfg, kind, dtype),
                stream,
                coll.transfer_us,
                cls="comm",
                args=kargs,
                coll=coll,
                collective=kind,
                communicator=pg.name,
                runtime=runtime,
            )
        host.spend(4.0, "post-launch")
    if not async_op and stream != current_stream:
        host.wait_stream(current_stream, stream)  # work.wait(): the caller's stream waits for the kernel
    return op
