"""overlapcheck/packed.py: lists of frozen objects held as shapes and one array of numbers give back every value
with its type, bit for bit, and cost a fraction of the objects."""

from __future__ import annotations

import gc
import math
import pickle
import struct
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from overlapcheck.model import Copies, PhaseMetrics, Split, StepMetrics
from overlapcheck.packed import PackedList, pack

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


def _bits(value: object) -> object:
    """A value with every float as its bits (so that -0.0 differs from 0.0 and NaN equals NaN), types kept."""
    if isinstance(value, float):
        return ("float", struct.pack("<d", value))
    if isinstance(value, bool | int | str) or value is None:
        return (type(value).__name__, value)
    if isinstance(value, dict):
        return ("dict", [(k, _bits(v)) for k, v in value.items()])
    if isinstance(value, list | tuple):
        return (type(value).__name__, [_bits(v) for v in value])
    fields = getattr(value, "__dataclass_fields__", None)
    assert fields is not None, type(value)
    return (type(value).__name__, [(n, _bits(getattr(value, n))) for n in fields])


def _step(i: int, exposed: float, overlap: float | None, count: int) -> StepMetrics:
    split = Split(count, 10.0 * (i + 1), 0.0, exposed, overlap)
    empty = Split(0, 0.0, 0.0, 0.0, None)
    kinds = {"all": split, "reduce_scatter": split, "all_gather": empty}
    return StepMetrics(
        step=i + 1,
        start_us=1.7e15 + i,
        duration_us=100.5,
        cpu_duration_us=99.0,
        compute_us=0.0,
        exposed_share=None if i % 2 else 0.25,
        collectives=kinds,
        memcpy=Copies(0, 0.0, 0.0),
        memset=Copies(2, -0.0, 1.5),
        phases={"forward": PhaseMetrics(3.0, kinds), "backward": PhaseMetrics(0.0, {})},
        period_start_us=None,
        period_us=12.0,
    )


ODD = [math.nan, -0.0, 0.0, math.inf, -math.inf, 5e-324, 1.7976931348623157e308, 0.1 + 0.2]


def test_steps_come_back_bit_for_bit_with_their_types() -> None:
    steps = [_step(i, ODD[i % len(ODD)], None if i == 3 else 0.5, 2**53 + 1 if i == 5 else i) for i in range(12)]
    packed = pack(steps)
    assert isinstance(packed, PackedList) and len(packed) == 12
    assert [_bits(s) for s in packed] == [_bits(s) for s in steps]
    assert _bits(packed[3]) == _bits(steps[3]) and _bits(packed[-1]) == _bits(steps[-1])
    assert [_bits(s) for s in packed[2:5]] == [_bits(s) for s in steps[2:5]]
    with pytest.raises(IndexError):
        packed[12]


def test_a_packed_list_is_a_list_to_its_readers() -> None:
    steps = [_step(i, 1.0 + i, 0.5, 1) for i in range(20)]
    packed = pack(steps)
    assert packed == steps and steps == list(packed) and packed != steps[:19]
    assert repr(packed) == repr(steps)
    blob = pickle.dumps(packed)  # a worker's result: its columns travel, each distinct shape once
    again = pickle.loads(blob)
    assert isinstance(again, PackedList) and again == steps and [_bits(s) for s in again] == [_bits(s) for s in steps]
    assert pack([]) == [] and len(pack([])) == 0


@dataclass(frozen=True)
class _Flags:
    on: bool
    n: int
    name: str


@dataclass
class _Mutable:
    x: float


@dataclass(frozen=True)
class _Derived:
    x: float
    y: float = field(init=False, default=0.0)


def test_bools_ints_and_strings_keep_their_types() -> None:
    items = [_Flags(True, 1, "a"), _Flags(1 == 0, 0, ""), _Flags(False, 1, "a"), _Flags(True, -(2**60), "é")]
    packed = pack(items)
    assert isinstance(packed, PackedList)
    assert [_bits(x) for x in packed] == [_bits(x) for x in items]  # True and 1 (equal, one hash) stay apart


@pytest.mark.parametrize("items", [[_Mutable(1.0)], [_Derived(1.0)], [{1, 2}], [_step(0, 1.0, 0.5, 1), {1}]])
def test_what_it_cannot_rebuild_is_kept_as_it_is(items: list[object]) -> None:
    assert pack(items) is items


def test_one_shape_per_distinct_shape_across_lists() -> None:
    a = pack([_step(i, 1.0 + i, 0.5, 1) for i in range(4)])
    b = pack([_step(i, 2.0 + i, 0.25, 3) for i in range(4)])
    assert isinstance(a, PackedList) and isinstance(b, PackedList)
    shapes = {id(s) for p in (a, b) for s in p._shapes}
    assert len(shapes) == 2  # odd and even steps differ (exposed_share None or not), nothing else does


numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.none(), st.booleans())


@given(st.lists(st.tuples(numbers, numbers, st.dictionaries(st.sampled_from("abc"), numbers)), max_size=6))
def test_any_mix_of_numbers_comes_back(rows: list[tuple[object, object, dict[str, object]]]) -> None:
    items = [(a, [b, b], d) for a, b, d in rows]
    packed = pack(items)
    assert [_bits(x) for x in packed] == [_bits(x) for x in items]


def _deep_size(root: object) -> int:
    """The bytes of every object reachable from `root`, each once (classes, functions and modules not counted)."""
    seen: set[int] = set()
    todo, total = [root], 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, type | types.ModuleType | types.FunctionType):
            continue
        seen.add(id(obj))
        total += sys.getsizeof(obj)
        todo.extend(gc.get_referents(obj))
    return total


def test_real_steps_cost_a_quarter_of_the_objects() -> None:
    """Per rank, the shapes not counted (held once per process). Counted object by object, not by tracemalloc,
    whose total moves with the interpreter's free lists and other threads (it failed CI at 0.26 of 0.244)."""
    from overlapcheck.pipeline import analyze

    report = analyze(SAMPLES / "seed-5201", jobs=1)
    steps = [list(r.steps) for r in report.ranks]
    blob = pickle.dumps(steps)
    objects = pickle.loads(blob)  # one copy, its equal parts shared as a worker's result shares them
    packed = [p for p in map(pack, objects) if isinstance(p, PackedList)]
    assert len(packed) == len(objects)
    assert [[_bits(s) for s in p] for p in packed] == [[_bits(s) for s in s_] for s_ in steps]
    as_objects = _deep_size(objects)
    as_columns = sum(sum(map(sys.getsizeof, (p, p._shapes, p._values))) for p in packed)
    assert as_columns < as_objects / 4, (as_columns, as_objects)  # 0.145 when written
    # what a worker sends back, rank by rank: smaller than the objects even at these 2 steps a rank (the shapes'
    # nodes travel with each rank; the numbers are 8 bytes each)
    travels = sum(len(pickle.dumps(p)) for p in packed)
    as_sent = sum(len(pickle.dumps(s)) for s in steps)
    assert travels < 0.9 * as_sent, (travels, as_sent)


def test_an_object_without_numbers_is_one_shared_object() -> None:
    packed = pack([_step(2 * i, 1.0, 0.5, 1) for i in range(3)])  # even steps: one shape
    empties = [s.collectives["all_gather"] for s in packed]
    assert empties[0] == Split(0, 0.0, 0.0, 0.0, None) and all(e is empties[0] for e in empties)
    assert packed[0].collectives["all"] is not packed[1].collectives["all"]  # numbers: rebuilt per item
