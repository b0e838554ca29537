"""Runs the step model on every rank at once and keeps what the profiler window would record."""

from __future__ import annotations

from dataclasses import dataclass

from overlapcheck.simulate.collectives import Fabric
from overlapcheck.simulate.config import SimConfig
from overlapcheck.simulate.engine import Device, GpuOp, Program, run
from overlapcheck.simulate.host import CpuEvent, Host, SyncEvent
from overlapcheck.simulate.model import RankStep

WARMUP_STEPS = 1
TS_ORIGIN_US = 2_000_000.0  # trace ts start near here; absolute time = baseTimeNanoseconds + ts * 1000
BASE_TIME_NS = 1_790_000_000_000_000_000


@dataclass
class RankRun:
    """What one rank's profiler recorded: CPU events, cuda_sync events and GPU activities."""

    rank: int
    node: int
    local_rank: int
    pid: int
    main_tid: int
    autograd_tid: int
    offset_us: float
    cpu: list[CpuEvent]
    syncs: list[SyncEvent]
    gpu: list[GpuOp]
    window: tuple[float, float]
    period_us: float = 0.0  # mean time between the ends of consecutive steps' GPU work (profiled steps)
    epoch_us: float = 0.0  # added to every ts: baseTimeNanoseconds / 1000 where the layout writes absolute time

    def ts(self, t: float) -> float:
        """A simulator time as written in the trace (µs, 3 decimals, this node's clock). With `epoch_us` (the
        ds013 layout: absolute µs since the epoch, as torch 1.13's Kineto wrote) the value is the float the trace
        holds (0.25 µs steps at 1.79e15), so that truth.json states exactly what the reader sees."""
        if self.epoch_us:
            return float(self.epoch_us + round(TS_ORIGIN_US + self.offset_us + t, 3))
        return round(TS_ORIGIN_US + self.offset_us + t, 3)

    def span(self, start: float, end: float) -> tuple[float, float]:
        """(ts, dur) as written: both rounded to the ns, dur from the rounded ends."""
        ts = self.ts(start)
        return ts, round(self.ts(end) - ts, 3)


@dataclass
class SimResult:
    cfg: SimConfig
    ranks: list[RankRun]


def simulate(cfg: SimConfig) -> SimResult:
    """Simulate warm-up plus `cfg.steps` profiled steps on all ranks; keep the profiled window."""
    fabric = Fabric(cfg)
    devices: dict[int, Device] = {}
    hosts: dict[int, Host] = {}
    programs: dict[int, Program] = {}
    marks: dict[int, list[float]] = {}
    for rank in range(cfg.world_size):
        pid = 2_900_000 + rank * 1_373 % 900_000
        devices[rank] = Device(rank, cfg.max_connections_1)
        hosts[rank] = Host(rank, devices[rank], cfg.seed, pid, pid, pid + 9_503)
        hosts[rank].t = 50.0 * (rank % 7) / 7.0  # processes do not start in lockstep
        marks[rank] = []
        programs[rank] = _program(RankStep(cfg, hosts[rank], fabric), cfg, marks[rank])
    run(programs, devices)
    return SimResult(
        cfg, [_window(cfg, rank, hosts[rank], devices[rank], marks[rank]) for rank in range(cfg.world_size)]
    )


def _program(rank_step: RankStep, cfg: SimConfig, marks: list[float]) -> Program:
    """Runs every step; `marks` gets each step's host start and the end of the last one."""
    first = cfg.first_step - WARMUP_STEPS
    for step in range(first, cfg.first_step + cfg.steps):
        marks.append(rank_step.host.t)
        yield from rank_step.step(step)
    marks.append(rank_step.host.t)


def step_period(device: Device, marks: list[float], profiled: int) -> float:
    """Mean time per profiled step between the ends of consecutive steps' GPU work (a step's work: what its
    host step launched). Unlike a step's own GPU duration, it does not count work that overlapped the previous
    step (a first all-gather issued while the previous optimizer step still ran) as step time: it is the
    throughput a change of the job would alter."""
    ends = [
        max((op.end_time for op in device.ops if lo <= op.launch_ts < hi), default=lo)
        for lo, hi in zip(marks[:-1], marks[1:], strict=False)
    ]
    return (ends[-1] - ends[-1 - profiled]) / profiled


def _window(cfg: SimConfig, rank: int, host: Host, device: Device, marks: list[float]) -> RankRun:
    start, end = marks[WARMUP_STEPS], marks[-1]
    cpu: list[CpuEvent] = []
    for ev in host.cpu:
        if ev.ts + ev.dur < start or ev.ts > end:
            continue
        if ev.ts < start:  # frames open when profiling began are recorded from the window start
            ev = CpuEvent(ev.cat, ev.name, ev.tid, start, ev.ts + ev.dur - start, ev.args, ev.flow)
        cpu.append(ev)
    gpu = [op for op in device.ops if start <= op.launch_ts <= end]
    syncs = [s for s in host.syncs if start <= s.ts <= end]
    offsets = cfg.clock_offset_us
    node = rank // cfg.gpus_per_node
    return RankRun(
        rank,
        node,
        rank % cfg.gpus_per_node,
        host.pid,
        host.main_tid,
        host.autograd_tid,
        offsets[node] if node < len(offsets) else 0.0,
        cpu,
        syncs,
        gpu,
        (start, end),
        step_period(device, marks, cfg.steps),
        BASE_TIME_NS / 1000 if cfg.layout == "ds013" else 0.0,
    )
