"""Per-rank results held compactly in the main process, which keeps every rank's until the report is written.

A rank's metrics are a tree of small frozen objects: per step, per phase and per collective kind a `Split`,
per step a memcpy and a memset `Copies`. Most of them are empty (a ZeRO-3 rank runs two or three of the seven
collective kinds; few traces have memsets), and an empty one is the same value on every rank. `compact` makes
every rank share one object per distinct empty value (the model's per-rank dataclasses are slotted, so an object is its
fields and nothing more): on tiny ranks this holds 41 of 56 Splits and all 14 Copies once per job instead of
once per rank, about half of a rank's metrics. The values, and so every report, are unchanged (the shared
object is chosen by `repr`, which tells 0.0 from -0.0). docs/scale.md.
"""

from __future__ import annotations

from typing import Any

from overlapcheck.model import Copies, OutsideSteps, RankMetrics, RankResult, Split, StepMetrics


class Compactor:
    """Shares the empty Splits and Copies of every rank it is given (one instance per analysis). It changes the
    results in place: they have just arrived (unpickled, or returned by the analysis in this process) and
    nothing else holds them; writing in place keeps no second copy alive (a pool's future still holds the
    result it delivered)."""

    def __init__(self) -> None:
        self._empty: dict[str, Any] = {}

    def result(self, result: RankResult) -> RankResult:
        m = result.metrics
        self._holder(m)
        for s in m.steps:
            self._holder(s)
            for phase in s.phases.values():
                self._splits(phase.collectives)
        for outside in (m.before_first_step, m.outside_steps):
            if outside is not None:
                self._holder(outside)
        return result

    def _holder(self, obj: RankMetrics | StepMetrics | OutsideSteps) -> None:
        self._splits(obj.collectives)
        for name in ("memcpy", "memset"):
            copies: Copies = getattr(obj, name)
            if copies.count == 0:
                object.__setattr__(obj, name, self._empty.setdefault(repr(copies), copies))  # frozen: see above

    def _splits(self, splits: Any) -> None:
        if not isinstance(splits, dict):
            return
        for kind, split in splits.items():
            if isinstance(split, Split) and split.count == 0:
                splits[kind] = self._empty.setdefault(repr(split), split)
