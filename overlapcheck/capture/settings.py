"""What the launcher tells each rank, through environment variables only.

Every rank (on every node) reads the same variables, so the capture behaves the same wherever the
launcher started the process. Names are listed in `ENV_NAMES` so that the launcher can forward them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from overlapcheck.errors import UserError
from overlapcheck.selection import Numbers, parse_numbers

ENV_OUT = "OVERLAPCHECK_OUT"  # run folder (absolute path)
ENV_SCHEDULE = "OVERLAPCHECK_SCHEDULE"  # "wait,warmup,active" in optimizer steps
ENV_WITH_STACK = "OVERLAPCHECK_WITH_STACK"  # "1" or "0"
ENV_RANKS = "OVERLAPCHECK_RANKS"  # rank spec: "all" or "0,2,8-15"
ENV_WITH_MODULES = "OVERLAPCHECK_WITH_MODULES"  # "1": torch.profiler with_stack and with_modules (module frames)
ENV_DISABLE = "OVERLAPCHECK_DISABLE"  # "1": the bootstrap does nothing (helper processes)
ENV_TEST_FAIL_PROFILER = "OVERLAPCHECK_TEST_FAIL_PROFILER"  # "1": the profiler raises (tests only)
ENV_NAMES = (ENV_OUT, ENV_SCHEDULE, ENV_WITH_STACK, ENV_RANKS, ENV_WITH_MODULES)


@dataclass(frozen=True)
class Schedule:
    """Profile `active` optimizer steps after skipping `wait` steps and warming up for `warmup` steps.

    Step numbers count completed optimizer steps from 0; the first profiled step is `wait + warmup`.
    """

    wait: int = 5
    warmup: int = 2
    active: int = 3

    def __post_init__(self) -> None:
        if self.wait < 1:
            raise UserError("--wait must be at least 1 (the first step is never profiled)")
        if self.warmup < 0 or self.active < 1:
            raise UserError("--warmup must be >= 0 and --active >= 1")

    @property
    def first(self) -> int:
        """First recorded step."""
        return self.wait + self.warmup

    @property
    def last(self) -> int:
        """Last recorded step (inclusive)."""
        return self.wait + self.warmup + self.active - 1

    @classmethod
    def from_steps(cls, spec: str, warmup: int = 1) -> Schedule:
        """`FIRST:LAST` (inclusive): record those steps, warming up for up to `warmup` steps before."""
        try:
            first_s, last_s = spec.split(":")
            first, last = int(first_s), int(last_s)
        except ValueError:
            raise UserError(f"--steps must look like FIRST:LAST, got {spec!r}") from None
        if first < 1 or last < first:
            raise UserError(f"--steps {spec}: need 1 <= FIRST <= LAST")
        warm = min(warmup, first - 1)
        return cls(wait=first - warm, warmup=warm, active=last - first + 1)

    def encode(self) -> str:
        return f"{self.wait},{self.warmup},{self.active}"

    @classmethod
    def decode(cls, text: str) -> Schedule:
        wait, warmup, active = (int(x) for x in text.split(","))
        return cls(wait=wait, warmup=warmup, active=active)


def parse_ranks(spec: str) -> Numbers | None:
    """Parse a rank spec: "all" -> None (every rank); "0,2,8-11" -> the ranks 0, 2 and 8 to 11, held as ranges
    (`0-100000000000` costs two integers, not a set), read as `analyze --ranks` reads its list."""
    spec = spec.strip()
    if spec.lower() in ("", "all"):
        return None
    return parse_numbers(spec, "-", "--ranks")


@dataclass(frozen=True)
class CaptureSettings:
    """Everything a rank needs to know to capture itself."""

    out: str
    schedule: Schedule
    with_stack: bool = False
    ranks: str = "all"
    with_modules: bool = False  # module frames (`nn.Module: ...`): with_stack and with_modules on the profiler

    def wants(self, rank: int) -> bool:
        """Whether `rank` is one of the ranks to profile."""
        chosen = parse_ranks(self.ranks)
        return chosen is None or rank in chosen

    def to_env(self) -> dict[str, str]:
        return {
            ENV_OUT: os.path.abspath(self.out),
            ENV_SCHEDULE: self.schedule.encode(),
            ENV_WITH_STACK: "1" if self.with_stack else "0",
            ENV_RANKS: self.ranks,
            ENV_WITH_MODULES: "1" if self.with_modules else "0",
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CaptureSettings | None:
        """The settings in `env`, or None when this process is not under `overlapcheck run`."""
        out = env.get(ENV_OUT)
        if not out or env.get(ENV_DISABLE) == "1":
            return None
        return cls(
            out=out,
            schedule=Schedule.decode(env.get(ENV_SCHEDULE, Schedule().encode())),
            with_stack=env.get(ENV_WITH_STACK) == "1",
            ranks=env.get(ENV_RANKS, "all"),
            with_modules=env.get(ENV_WITH_MODULES) == "1",
        )
