"""The JSON report's writer (`_Writer`, overlapcheck/report/json.py) writes what `json.dumps(indent=2)` writes for
the rounded plain document (`_clean(_to_plain(value))`), byte for byte: on real reports' ranks (as the analysis
holds them, their empty parts shared by overlapcheck/compact.py), on odd values (floats at the edges, NaN and
infinities, numpy scalars, enums, unicode, nested empties, non-str keys, omitted fields) and on random trees;
and it writes a shared object once per depth."""

from __future__ import annotations

import collections
import copy
import dataclasses
import enum
import json
import math
import random
import struct
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from builders import ROOT

import overlapcheck
from overlapcheck.compact import Compactor
from overlapcheck.model import RankResult, Report, Split, _to_plain
from overlapcheck.report import json as json_report
from overlapcheck.report.json import JsonRenderer, _clean, _Writer, document_json

DIGITS = (6, None, 0, 2)


def reference(value: Any, digits: int | None, depth: int = 0) -> str:
    """What the report held before the writer: the plain value, rounded, through json.dumps(indent=2)."""
    text = json.dumps(_clean(_to_plain(value), digits), indent=2, ensure_ascii=False)
    return text.replace("\n", "\n" + "  " * depth)


@pytest.fixture(scope="module")
def reports() -> list[Report]:
    samples = ROOT / "sample_traces"
    return [overlapcheck.analyze(samples / name, jobs=1) for name in ("straggler", "offload-sync", "degraded-network")]


def test_real_ranks_as_the_reference_writes_them(reports: list[Report]) -> None:
    for report in reports:
        compacted = [Compactor().result(RankResult(copy.deepcopy(m))).metrics for m in report.ranks]
        for digits in DIGITS:
            writer = _Writer(digits)  # one writer for every rank, as in a report: its kept texts are reused
            for rank in [*report.ranks, *compacted]:
                for depth in (0, 2):
                    assert writer.text(rank, depth) == reference(rank, digits, depth)
            doc = dataclasses.replace(report, ranks=[]).to_dict()
            assert writer.text(doc, 1) == reference(doc, digits, 1)
            assert JsonRenderer(digits).render(report) == document_json(report.to_dict(), digits)


class Level(enum.IntEnum):
    LOW = 1


class Name(str, enum.Enum):
    A = "a-é"


class Tagged(str):
    pass


class Fraction(float):
    pass


@dataclass(frozen=True, slots=True)
class Leaf:
    count: int
    value: float
    note: str | None = field(default=None, metadata={"omit_none": True})
    flag: bool | None = None


@dataclass
class Mutable:
    leaf: Leaf
    items: list[Any]
    hidden: Any = field(default="never written", metadata={"json": False})
    maybe: Any = field(default=None, metadata={"omit_none": True})


@dataclass(frozen=True)
class Nothing:
    gone: Any = field(default=None, metadata={"omit_none": True})


FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.5,
    1 / 3,
    2 / 3,
    0.1 + 0.2,
    1e-7,
    5e-7,
    4.9999995e-7,
    0.0000005,
    123456.0000005,
    1e16,
    1.2345678901234567e21,
    -1e300,
    1.7976931348623157e308,
    5e-324,
    2.2250738585072014e-308,
    math.pi,
    math.nan,
    math.inf,
    -math.inf,
    np.float64(1 / 7),
    np.float64(math.nan),
    np.float64(-math.inf),
    Fraction(0.125),
    Fraction(math.nan),
]
STRINGS = [
    "",
    "plain",
    "é ü ß",
    "日本語",
    "emoji 🚀",
    'quote " and \\ back',
    "\x00\x01\x1f\x7f",
    "line\nbreak\ttab",
    "\u2028\u2029",
    "\ud800 lone",
]
ODD_SCALARS: list[Any] = [*FLOATS, *STRINGS, 0, -1, 2**70, -(2**63), True, False, None, Level.LOW, Name.A, Tagged("t")]


def odd_document() -> Any:
    shared = Leaf(0, 0.0)  # one object in many places and at many depths, as compact.py shares them
    return {
        "scalars": ODD_SCALARS,
        "leaves": [shared, Leaf(3, math.nan, "n"), Leaf(1, -0.0, None, True), shared],
        "deep": {"a": {"b": [shared, {"c": shared}, [[shared]]]}},
        "empties": [{}, [], (), [[]], [{}], {"x": {}}, {"y": []}, Nothing(), [Nothing()], types.MappingProxyType({})],
        "tuples": (1, (2.5, ()), [3, (math.inf,)]),
        "mutable": Mutable(shared, [shared, Leaf(2, 1e-9)], maybe={"k": -0.0}),
        "mutable-none": Mutable(Leaf(1, 1.0), []),
        "keys": {1: "int", 2.5: "float", None: "none", False: "bool", "1": "str after int: replaces it"},
        "key-collisions": {"a": 1, Tagged("a"): 2, Level.LOW: 3},
        "mapping-types": [collections.OrderedDict([("z", 1), ("a", 2.25)]), types.MappingProxyType({"m": [1.5]})],
        "keys-odd": {s: s for s in STRINGS},
        "numpy-in-dataclass": Leaf(1, np.float64(0.30000000000000004)),
    }


@pytest.mark.parametrize("digits", DIGITS)
def test_odd_values_as_the_reference_writes_them(digits: int | None) -> None:
    doc = odd_document()
    writer = _Writer(digits)
    for depth in (0, 1, 3):
        assert writer.text(doc, depth) == reference(doc, digits, depth)
    for value in [*ODD_SCALARS, *doc.values()]:
        assert writer.text(value, 2) == reference(value, digits, 2)


@pytest.mark.parametrize("value", [{1, 2}, np.int64(3), np.float32(1.5), np.bool_(True), b"bytes", object()])
def test_what_json_cannot_write_is_a_type_error_as_in_json(value: Any) -> None:
    with pytest.raises(TypeError) as expected:
        reference([value], 6)
    with pytest.raises(TypeError) as got:
        _Writer(6).text([value])
    assert str(got.value) == str(expected.value)


def random_float(rng: random.Random) -> float:
    pick = rng.random()
    if pick < 0.3:
        return struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]  # any double, NaN and inf too
    if pick < 0.6:
        return rng.uniform(-1, 1) * 10 ** rng.randint(-12, 12)
    return rng.choice(FLOATS)


def random_tree(rng: random.Random, depth: int, shared: list[Leaf]) -> Any:
    pick = rng.random()
    if depth > 3 or pick < 0.35:
        return rng.choice([random_float(rng), rng.choice(ODD_SCALARS), rng.randint(-(10**12), 10**12)])
    if pick < 0.5:
        return rng.choice(shared) if shared and rng.random() < 0.5 else Leaf(rng.randint(0, 9), random_float(rng))
    if pick < 0.7:
        return [random_tree(rng, depth + 1, shared) for _ in range(rng.randint(0, 4))]
    if pick < 0.8:
        return Mutable(rng.choice(shared), [random_tree(rng, depth + 1, shared)], maybe=rng.choice([None, 1.5]))
    keys = [rng.choice(STRINGS), rng.randint(0, 3), str(rng.randint(0, 3)), rng.choice(FLOATS[:4])]
    return {rng.choice(keys): random_tree(rng, depth + 1, shared) for _ in range(rng.randint(0, 4))}


def test_random_trees_as_the_reference_writes_them() -> None:
    rng = random.Random(22)
    shared = [Leaf(0, 0.0), Leaf(0, -0.0), Leaf(1, 1 / 3, "s")]
    for digits in DIGITS:
        writer = _Writer(digits)
        for _ in range(300):
            tree = random_tree(rng, 0, shared)
            depth = rng.randint(0, 3)
            assert writer.text(tree, depth) == reference(tree, digits, depth)


def test_a_shared_object_is_written_once_per_depth(monkeypatch: pytest.MonkeyPatch) -> None:
    split = Split(0, 0.0, 0.0, 0.0, None)
    floats = []
    writer = _Writer(6)
    real = writer._float
    monkeypatch.setattr(writer, "_float", lambda v: floats.append(v) or real(v))
    ranks = [{"collectives": {"all": split, "all_gather": split}} for _ in range(100)]
    assert writer.text(ranks, 2) == reference(ranks, 6, 2)
    assert len(floats) == 3  # its three floats, once: every other place reuses the text
    monkeypatch.setattr(json_report, "SHARED_TEXTS", 1)  # full: the kept texts start over, the text stays the same
    writer = _Writer(6)
    other = Split(1, 2.0, 1.0, 1.0, 0.5)
    mixed = [split, other, split, [other, split]]
    assert writer.text(mixed, 1) == reference(mixed, 6, 1)


@dataclass
class Open:
    count: int


@dataclass(frozen=True)
class Holder:
    values: list[float]


def test_only_what_cannot_change_is_written_from_a_kept_text() -> None:
    writer = _Writer(6)
    open_, holder = Open(1), Holder([1.0])
    assert writer.text([open_, holder]) == reference([open_, holder], 6)
    open_.count = 2  # not frozen: written anew
    holder.values.append(2.5)  # frozen, but holds a list: written anew
    assert writer.text([open_, holder]) == reference([open_, holder], 6)
