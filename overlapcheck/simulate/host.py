"""The host side of one rank: a clock, the CPU events the profiler would record, and the CUDA
runtime calls that launch GPU work, record/wait events and block on synchronization."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from overlapcheck.simulate.engine import LAUNCH_LATENCY_US, Collective, Device, Event, GpuOp
from overlapcheck.simulate.hardware import jitter

CBID = {
    "cudaLaunchKernel": 211,
    "cudaMemcpyAsync": 41,
    "cudaMemsetAsync": 51,
    "cudaEventRecord": 135,
    "cudaStreamWaitEvent": 147,
    "cudaEventSynchronize": 137,
    "cudaStreamSynchronize": 131,
    "cudaDeviceSynchronize": 165,
    "cudaEventQuery": 138,
    "cudaLaunchKernelExC": 430,
}
RUNTIME_US = {
    "cudaLaunchKernel": 5.0,
    "cudaLaunchKernelExC": 9.0,
    "cudaMemcpyAsync": 7.0,
    "cudaMemsetAsync": 6.0,
    "cudaEventRecord": 1.5,
    "cudaStreamWaitEvent": 1.5,
    "cudaEventQuery": 1.2,
    "cudaEventSynchronize": 2.0,
    "cudaStreamSynchronize": 2.5,
    "cudaDeviceSynchronize": 3.0,
}
SYNC_KIND = {
    "cudaEventSynchronize": "Event Sync",
    "cudaStreamSynchronize": "Stream Sync",
    "cudaDeviceSynchronize": "Context Sync",
    "cudaStreamWaitEvent": "Stream Wait Event",
}


@dataclass(eq=False)
class CpuEvent:
    """A CPU-side trace event (cpu_op, user_annotation, python_function, cuda_runtime)."""

    cat: str
    name: str
    tid: int
    ts: float
    dur: float = 0.0
    args: dict[str, Any] = field(default_factory=dict)
    flow: str | None = None  # "s": starts an ac2g flow to GPU activity; "f": kineto's dangling end


@dataclass(eq=False)
class SyncEvent:
    """A `cuda_sync` activity (enable_cuda_sync_events=True), drawn on a GPU row."""

    kind: str
    stream: int
    ts: float
    dur: float
    corr: int
    ext: int
    args: dict[str, Any]


class Host:
    """One rank's CPU: runs its program, keeps the clock and the records the profiler writes."""

    def __init__(self, rank: int, device: Device, seed: int, pid: int, main_tid: int, autograd_tid: int):
        self.rank = rank
        self.device = device
        self.seed = seed
        self.pid = pid
        self.main_tid = main_tid
        self.autograd_tid = autograd_tid
        self.tid = main_tid
        self.t = 0.0
        self.cpu: list[CpuEvent] = []
        self.syncs: list[SyncEvent] = []
        self._corr = 1000 + rank * 7
        self._ext = 0
        self._pyid = 0
        self._ext_stack: list[int] = []
        self._py_stack: dict[int, list[int]] = {}
        self._event_id = 0
        self._n = 0

    # -- clock ------------------------------------------------------------------------------
    def spend(self, us: float, *key: object) -> None:
        """Advance the clock by `us` (with a small deterministic jitter keyed by `key`)."""
        self._n += 1
        self.t += us * (jitter(self.seed, self.rank, self._n, *key, spread=0.1) if key else 1.0)

    def next_corr(self) -> int:
        self._corr += 3
        return self._corr

    # -- scopes -----------------------------------------------------------------------------
    def cpu_op(
        self, name: str, args: dict[str, Any] | None = None, cat: str = "cpu_op", cost: float = 3.0
    ) -> AbstractContextManager[CpuEvent]:
        """A CPU op range: `cost` host us on entry (jittered by name), 1 us on exit."""
        self._ext += 1
        ev = CpuEvent(
            cat, name, self.tid, self.t, 0.0, {"External id": self._ext, "Record function id": 0, **(args or {})}
        )
        self.cpu.append(ev)
        self._ext_stack.append(self._ext)
        self.spend(cost, name)
        return _CpuOp(self, ev)

    def annotation(self, name: str) -> AbstractContextManager[CpuEvent]:
        """A `record_function` range (`user_annotation`), e.g. ProfilerStep#N or nccl:*."""
        return self.cpu_op(name, cat="user_annotation", cost=1.0)

    @contextmanager
    def marks(self, cat: str, *names: str) -> Iterator[None]:
        """Nested ranges of `cat` (python_function frames, or user_annotation ranges) that take no host time and
        leave the jitter sequence alone, so the timeline is the one without them (module frames)."""
        stack = self._py_stack.setdefault(self.tid, [])
        opened = []
        for name in names:
            args: dict[str, Any] = {}
            if cat == "python_function":
                self._pyid += 1
                args = {"Python parent id": stack[-1] if stack else None, "Python id": self._pyid}
                stack.append(self._pyid)
            ev = CpuEvent(cat, name, self.tid, self.t, 0.0, args)
            self.cpu.append(ev)
            opened.append(ev)
        try:
            yield
        finally:
            for ev in reversed(opened):
                if cat == "python_function":
                    stack.pop()
                ev.dur = self.t - ev.ts

    def frames(self, *names: str) -> AbstractContextManager[None]:
        """Nested python_function frames, outermost first."""
        stack = self._py_stack.setdefault(self.tid, [])
        opened = []
        for name in names:
            self._pyid += 1
            parent = stack[-1] if stack else None
            ev = CpuEvent(
                "python_function", name, self.tid, self.t, 0.0, {"Python parent id": parent, "Python id": self._pyid}
            )
            self.cpu.append(ev)
            stack.append(self._pyid)
            opened.append(ev)
            self.spend(1.5, name)
        return _Frames(self, stack, opened)

    # -- runtime calls ----------------------------------------------------------------------
    def _runtime(self, name: str, flow: str | None, extra_us: float = 0.0) -> CpuEvent:
        corr = self.next_corr()
        args: dict[str, Any] = {"cbid": CBID[name], "correlation": corr}
        if self._ext_stack:
            args = {"External id": self._ext_stack[-1], **args}
        ev = CpuEvent("cuda_runtime", name, self.tid, self.t, 0.0, args, flow)
        self.cpu.append(ev)
        self.spend(RUNTIME_US[name] + extra_us, name)
        ev.dur = self.t - ev.ts
        return ev

    def launch(
        self,
        name: str,
        stream: int,
        dur: float,
        cls: str = "compute",
        kind: str = "kernel",
        args: dict[str, Any] | None = None,
        coll: Collective | None = None,
        collective: str | None = None,
        communicator: str | None = None,
        runtime: str | None = None,
    ) -> GpuOp:
        """Launch a kernel / memcpy / memset on `stream`; returns the op (times resolved later)."""
        rt_name = (
            runtime or {"kernel": "cudaLaunchKernel", "memcpy": "cudaMemcpyAsync", "memset": "cudaMemsetAsync"}[kind]
        )
        rt = self._runtime(rt_name, "s")
        op = GpuOp(
            self.rank,
            kind,
            cls,
            name,
            stream,
            dur,
            rt.ts + rt.dur + LAUNCH_LATENCY_US,
            [],
            rt.args["correlation"],
            rt.args.get("External id", 0),
            rt.ts,
            rt.tid,
            dict(args or {}),
            coll,
            collective,
        )
        if coll is not None:
            coll.ops[self.rank] = op
        self.device.enqueue(op, communicator)
        return op

    def record(self, stream: int) -> Event:
        """cudaEventRecord on `stream`."""
        rt = self._runtime("cudaEventRecord", "f")
        self._event_id += 1
        return Event(self.device.work_on(stream), stream, rt.args["correlation"], self._event_id)

    def wait_event(self, stream: int, event: Event) -> None:
        """cudaStreamWaitEvent: later work on `stream` starts after the event's op ends."""
        rt = self._runtime("cudaStreamWaitEvent", "s")
        self.device.wait(stream, event)
        self._sync_record(
            rt,
            "Stream Wait Event",
            stream,
            {
                "wait_on_stream": event.stream,
                "wait_on_cuda_event_record_corr_id": event.record_corr,
                "wait_on_cuda_event_id": event.event_id,
            },
        )

    def wait_stream(self, waiter: int, waitee: int) -> None:
        """torch `waiter.wait_stream(waitee)`: an event recorded on waitee, waited on by waiter."""
        if waiter != waitee:
            self.wait_event(waiter, self.record(waitee))

    def _sync_record(self, rt: CpuEvent, kind: str, stream: int, extra: dict[str, Any]) -> None:
        args = {"cuda_sync_kind": kind, **extra, "stream": stream}
        self.syncs.append(
            SyncEvent(
                kind,
                stream,
                rt.ts + 0.5,
                max(rt.dur - 1.0, 0.5),
                rt.args["correlation"],
                rt.args.get("External id", 0),
                args,
            )
        )

    # -- blocking calls (generators: `yield from host.synchronize_...`) ---------------------
    def _block(self, name: str, ops: list[GpuOp]) -> Generator[GpuOp, None, CpuEvent]:
        corr = self.next_corr()
        args: dict[str, Any] = {"cbid": CBID[name], "correlation": corr}
        if self._ext_stack:
            args = {"External id": self._ext_stack[-1], **args}
        ev = CpuEvent("cuda_runtime", name, self.tid, self.t, 0.0, args, "s")
        self.cpu.append(ev)
        for op in ops:
            if op.end is None:
                yield op  # the engine resumes this program only once the op's end is known
            self.t = max(self.t, op.end_time)
        self.spend(RUNTIME_US[name], name)
        ev.dur = self.t - ev.ts
        return ev

    def synchronize_event(self, event: Event) -> Generator[GpuOp, None, None]:
        rt = yield from self._block("cudaEventSynchronize", event.ops)
        self._sync_record(
            rt,
            "Event Sync",
            -1,
            {
                "wait_on_stream": event.stream,
                "wait_on_cuda_event_record_corr_id": event.record_corr,
                "wait_on_cuda_event_id": event.event_id,
            },
        )

    def synchronize_stream(self, stream: int) -> Generator[GpuOp, None, None]:
        rt = yield from self._block("cudaStreamSynchronize", self.device.work_on(stream))
        self._sync_record(rt, "Stream Sync", stream, {})

    def synchronize_device(self) -> Generator[GpuOp, None, None]:
        ops = [op for stream in list(self.device.last) for op in self.device.work_on(stream)]
        rt = yield from self._block("cudaDeviceSynchronize", ops)
        self._sync_record(rt, "Context Sync", 4294967295, {})

    def blocking_copy(self, name: str, stream: int, dur: float, args: dict[str, Any]) -> Generator[GpuOp, None, GpuOp]:
        """A cudaMemcpyAsync that returns only once its copy has ended (from pageable host memory the driver
        stages the data and the call waits for the stream's queue and the copy)."""
        op = self.launch(name, stream, dur, cls="memcpy", kind="memcpy", args=args)
        rt = self.cpu[-1]
        if op.end is None:
            yield op
        self.t = max(self.t, op.end_time)
        rt.dur = self.t - rt.ts
        return op

    def query(self, event: Event) -> Generator[GpuOp, None, bool]:
        """cudaEventQuery: True when the event's work has finished by now."""
        self._runtime("cudaEventQuery", "f")
        for op in event.ops:
            if op.end is None:
                yield op
        return all(op.end_time <= self.t for op in event.ops)


# The two scopes the simulator opens most (hundreds of thousands per 32-rank set) as plain context managers: the
# work on entry is done by Host.cpu_op / Host.frames when they are called, as a @contextmanager did it on entry.
class _CpuOp:
    __slots__ = ("host", "ev")

    def __init__(self, host: Host, ev: CpuEvent):
        self.host, self.ev = host, ev

    def __enter__(self) -> CpuEvent:
        return self.ev

    def __exit__(self, *exc: object) -> None:
        host = self.host
        host.spend(1.0)
        host._ext_stack.pop()
        self.ev.dur = host.t - self.ev.ts


class _Frames:
    __slots__ = ("host", "stack", "opened")

    def __init__(self, host: Host, stack: list[int], opened: list[CpuEvent]):
        self.host, self.stack, self.opened = host, stack, opened

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        host, stack = self.host, self.stack
        for ev in reversed(self.opened):
            host.spend(0.5)
            stack.pop()
            ev.dur = host.t - ev.ts
