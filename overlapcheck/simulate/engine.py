"""A discrete-event model of CUDA streams on many ranks at once.

Each rank has a host (CPU) that runs a program (a generator) and launches GPU work onto streams.
A GPU op starts at the latest of: its launch time plus launch latency, the end of the previous op
on its stream, the ends of the events its stream was told to wait for (cudaStreamWaitEvent), the
end of the previous op of the same NCCL communicator (NCCL serializes one communicator's kernels),
and, with CUDA_DEVICE_MAX_CONNECTIONS=1, the end of the previously launched op of any stream.
A collective ends for every rank of its group at max(start over the group) + transfer time, so a
late rank makes the others' kernels long. A host that synchronizes yields the op it waits for and
resumes when that op's end is known; ranks are advanced round-robin until every program is done.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

LAUNCH_LATENCY_US = 4.0


@dataclass(eq=False)
class Collective:
    """One collective call, shared by the ranks of its group."""

    pg: str
    seq: int
    kind: str
    size: int  # ranks in the group
    transfer_us: float
    ops: dict[int, GpuOp] = field(default_factory=dict)
    nbytes: float = 0.0  # the full buffer (nccl-tests size): gathered / unreduced bytes


@dataclass(eq=False)
class GpuOp:
    """One kernel, memcpy or memset on one stream of one rank."""

    rank: int
    kind: str  # kernel | memcpy | memset
    cls: str  # compute | comm | memcpy | memset
    name: str
    stream: int
    dur: float
    ready: float
    deps: list[GpuOp]
    corr: int
    ext: int
    launch_ts: float
    launch_tid: int
    args: dict[str, Any]
    coll: Collective | None = None
    collective: str | None = None  # reduce_scatter | all_gather | all_reduce for comm ops
    start: float | None = None
    end: float | None = None
    modules: tuple[str, ...] = ()  # the modules a collective serves (module_frames): its truth

    @property
    def start_time(self) -> float:
        """`start` of an op the engine has resolved (every op once `run` returns)."""
        if self.start is None:
            raise RuntimeError(f"rank {self.rank}: {self.name} has no start time yet")
        return self.start

    @property
    def end_time(self) -> float:
        """`end` of an op the engine has resolved (every op once `run` returns)."""
        if self.end is None:
            raise RuntimeError(f"rank {self.rank}: {self.name} has no end time yet")
        return self.end


@dataclass(eq=False)
class Event:
    """A recorded CUDA event: complete when `ops` (the stream's work at record time) have ended."""

    ops: list[GpuOp]
    stream: int
    record_corr: int
    event_id: int


class Device:
    """The streams of one rank's GPU."""

    def __init__(self, rank: int, serialize_all: bool):
        self.rank = rank
        self.serialize_all = serialize_all
        self.last: dict[int, GpuOp] = {}
        self.waits: dict[int, list[GpuOp]] = {}
        self.last_on_comm: dict[str, GpuOp] = {}
        self.last_launched: GpuOp | None = None
        self.unresolved: list[GpuOp] = []
        self.ops: list[GpuOp] = []

    def enqueue(self, op: GpuOp, communicator: str | None) -> None:
        deps = list(self.waits.pop(op.stream, []))
        if op.stream in self.last:
            deps.append(self.last[op.stream])
        if communicator is not None:
            if communicator in self.last_on_comm:
                deps.append(self.last_on_comm[communicator])
            self.last_on_comm[communicator] = op
        if self.serialize_all and self.last_launched is not None:
            deps.append(self.last_launched)
        op.deps = deps
        self.last[op.stream] = op
        self.last_launched = op
        self.unresolved.append(op)
        self.ops.append(op)

    def wait(self, stream: int, event: Event) -> None:
        self.waits.setdefault(stream, []).extend(event.ops)

    def work_on(self, stream: int) -> list[GpuOp]:
        """What an event recorded on `stream` now would wait for: its last op and pending waits."""
        ops = list(self.waits.get(stream, []))
        if stream in self.last:
            ops.append(self.last[stream])
        return ops

    def resolve(self) -> bool:
        """Give start/end to every op whose inputs are known; True if anything changed."""
        changed = False
        left = []
        for op in self.unresolved:
            if _resolve(op):
                changed = True
            else:
                left.append(op)
        self.unresolved = left
        return changed


def _resolve(op: GpuOp) -> bool:
    if op.start is None:
        t = op.ready
        for dep in op.deps:
            if dep.end is None:
                return False
            t = max(t, dep.end)
        op.start = t
    if op.end is None:
        coll = op.coll
        if coll is None:
            op.end = op.start + op.dur
        else:
            starts = [o.start for o in coll.ops.values() if o.start is not None]
            if len(coll.ops) < coll.size or len(starts) < len(coll.ops):
                return False
            end = max(starts) + coll.transfer_us
            for o in coll.ops.values():
                o.end = end
    return True


Program = Generator[GpuOp, None, None]


def run(programs: dict[int, Program], devices: dict[int, Device]) -> None:
    """Advance every rank's program until all are done; a program yields the op it waits for."""
    waiting: dict[int, GpuOp | None] = {r: None for r in programs}
    active = dict(programs)
    while active:
        progressed = False
        for rank in list(active):
            while True:
                op = waiting[rank]
                if op is not None and op.end is None:
                    devices[rank].resolve()
                    if op.end is None:
                        break
                try:
                    waiting[rank] = next(active[rank])
                except StopIteration:
                    del active[rank]
                    waiting[rank] = None
                    break
                progressed = True
        changed = True
        while changed:
            changed = False
            for dev in devices.values():
                changed = dev.resolve() or changed
            progressed = progressed or changed
        if active and not progressed:
            raise RuntimeError(f"simulation deadlock: ranks {sorted(active)} wait forever")
    for dev in devices.values():
        while dev.resolve():
            pass
        if dev.unresolved:
            raise RuntimeError(f"rank {dev.rank}: {len(dev.unresolved)} GPU ops never ran")
