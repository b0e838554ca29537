"""Per-rank results held compactly in the main process, which keeps every rank's until the report is written.

A rank's metrics are a tree of small frozen objects: per step, per phase and per collective kind a `Split`,
per step a memcpy and a memset `Copies`. Most of them are empty (a ZeRO-3 rank runs two or three of the seven
collective kinds; few traces have memsets), and an empty one is the same value on every rank. `compact` makes
every rank share one object per distinct empty value (the model's per-rank dataclasses are slotted, so an object is its
fields and nothing more): on tiny ranks this holds 41 of 56 Splits and all 14 Copies once per job instead of
once per rank, about half of a rank's metrics. The values, and so every report, are unchanged (the shared
object is chosen by `repr`, which tells 0.0 from -0.0). The collective keys of the ranks' signatures, the same
on every rank, are held once per job too. docs/scale.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
from array import array
from typing import Any

import numpy as np

from overlapcheck.model import (
    CollectiveSignature,
    Copies,
    ModuleKey,
    Modules,
    OutsideSteps,
    PackedModules,
    RankMetrics,
    RankResult,
    Split,
    StepMetrics,
)
from overlapcheck.packed import PackedList, pack

# the signature's lists of numbers held as arrays: (field, array type code, the type every item must have)
_SIGNATURE_NUMBERS = (
    ("dur", "d", float),
    ("exposed", "d", float),
    ("inherent_parts_us", "d", float),
    ("tail_us", "d", float),
    ("host_gap_frame_us", "d", float),
    ("bytes", "q", int),
    ("group", "q", int),
)


def with_packed_steps(result: RankResult) -> RankResult:
    """`result` with its steps as columns (overlapcheck/packed.py): what a worker sends back (its pickle a few KB,
    not one object per step, phase and collective kind), so that it arrives packed."""
    steps = pack(result.metrics.steps)
    if steps is result.metrics.steps:
        return result
    return dataclasses.replace(result, metrics=dataclasses.replace(result.metrics, steps=steps))


class Compactor:
    """Shares the empty Splits and Copies of every rank it is given (one instance per analysis). It changes the
    results in place: they have just arrived (unpickled, or returned by the analysis in this process) and
    nothing else holds them; writing in place keeps no second copy alive (a pool's future still holds the
    result it delivered)."""

    def __init__(self) -> None:
        self._empty: dict[str, Any] = {}
        self._keys: dict[ModuleKey, ModuleKey] = {}  # each distinct module row key once per job
        self._notes: dict[str, str] = {}
        self._sig_keys: dict[str, str] = {}  # each distinct collective key (`group|kind|n-th`) once per job

    def result(self, result: RankResult) -> RankResult:
        m = result.metrics
        self._holder(m)
        steps = pack(m.steps)  # packed by the worker already, unless it ran in this process
        if isinstance(steps, PackedList):
            object.__setattr__(m, "steps", steps)  # frozen: see above
        else:  # a step holds what the packer does not rebuild: its empty parts shared, as the rank's
            for s in m.steps:
                self._holder(s)
                for phase in s.phases.values():
                    self._splits(phase.collectives)
        for outside in (m.before_first_step, m.outside_steps):
            if outside is not None:
                self._holder(outside)
        if isinstance(result.modules, Modules):
            object.__setattr__(result, "modules", self.modules(result.modules))  # frozen: see above
        if result.signature is not None:
            self._signature(result.signature)
        return result

    def _signature(self, sig: CollectiveSignature) -> None:
        """Every rank names the same collectives: one string per key per job, not one per rank (about 60 bytes a
        collective); each list of numbers an array (8 bytes a number against 32)."""
        if isinstance(sig.keys, list):
            sig.keys[:] = [self._sig_keys.setdefault(k, k) for k in sig.keys]
        for name, code, kind in _SIGNATURE_NUMBERS:
            values = getattr(sig, name)
            if isinstance(values, list) and all(type(v) is kind for v in values):
                with contextlib.suppress(OverflowError):  # an int past int64 (no real size): kept as the list
                    object.__setattr__(sig, name, array(code, values))  # frozen: see above

    def modules(self, modules: Modules) -> PackedModules:
        """A rank's MODULES as arrays, its row keys (and notes) shared with every other rank's: about 40 bytes a
        row against 200 for a ModuleComm, and the module paths' strings held once per job."""
        keys = tuple(
            self._keys.setdefault(key, key)
            for key in ((r.module, r.kind, r.phase, r.source, r.cls) for r in modules.rows)
        )
        counts = np.array([r.count for r in modules.rows], dtype=np.int64)
        values = np.array([(r.time_us, r.exposed_us, r.hidden_us) for r in modules.rows], dtype=np.float64)
        notes = tuple(self._notes.setdefault(n, n) for n in modules.notes)
        return PackedModules(modules.ranks, modules.rank_steps, keys, counts, values.reshape(-1, 3), notes)

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
