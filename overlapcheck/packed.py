"""Trees of frozen objects held as columns: a list of like objects as one array of numbers and, per item, a
shared shape (overlapcheck/compact.py keeps every rank's steps so, docs/scale.md).

A rank's steps are a tree of small objects (per step a `StepMetrics`, its phases, a `Split` per collective kind
and a `Copies`), about 1.35 KB a step as objects. What differs between two steps of a job is mostly their
numbers; the rest (the classes, the dicts' keys, which values are None or zero) is the step's *shape*, and a job
has a handful of shapes. `pack` splits each item into its shape, held once per process, and its numbers,
appended to one float64 array per list; `PackedList` is that list as a read-only `Sequence`, which rebuilds an
item when it is read (one generated function call per item). The values come back unchanged: a float64 holds
every float bit for bit (-0.0 and NaN included) and every int below 2**53; `+0.0` and `0` are part of the
shape (a ZeRO-3 step's empty collective kinds cost nothing), and so are None, bools, strings and larger ints.
"""

from __future__ import annotations

import dataclasses
import math
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

T = TypeVar("T")

_EXACT = 2**53  # every int of smaller magnitude is a float64 exactly

Node = tuple[Any, ...]  # a shape as a hashable tree: ("f",) a number from the array, ("c", type, value), ...


class Unpackable(TypeError):
    """An item holds something `pack` does not rebuild (a set, a mutable object, a dataclass with init=False
    fields): the list is kept as it is."""


@dataclasses.dataclass(frozen=True, eq=False)
class Shape:
    """One distinct shape: how many numbers an item of it takes from the array, and the function that rebuilds
    the item from them (`build(values, start)`)."""

    node: Node
    width: int
    build: Callable[[Sequence[float], int], Any]


class PackedList(Sequence[T], Generic[T]):
    """A list of like objects held as shapes and one array of numbers (see the module); reading an item
    rebuilds it, equal to the original in value and type. Compares equal to a list of equal items."""

    __slots__ = ("_shapes", "_values")

    def __init__(self, shapes: tuple[Shape, ...], values: array[float]) -> None:
        self._shapes = shapes
        self._values = values

    def __len__(self) -> int:
        return len(self._shapes)

    def __iter__(self) -> Iterator[T]:
        values, at = self._values, 0
        for shape in self._shapes:
            yield shape.build(values, at)
            at += shape.width

    @overload
    def __getitem__(self, index: int) -> T: ...
    @overload
    def __getitem__(self, index: slice) -> list[T]: ...
    def __getitem__(self, index: int | slice) -> T | list[T]:
        if isinstance(index, slice):
            return list(self)[index]
        n = len(self._shapes)
        if not -n <= index < n:
            raise IndexError("PackedList index out of range")
        index %= n
        start = sum(s.width for s in self._shapes[:index])
        item: T = self._shapes[index].build(self._values, start)
        return item

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PackedList | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a list's equality, a list's (lack of) hash

    def __repr__(self) -> str:
        return repr(list(self))

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its columns: each distinct shape once (as its node), an index per item, the numbers. A
        worker's result travels so (a few KB a rank, not its steps' objects) and arrives packed."""
        distinct = list(dict.fromkeys(self._shapes))
        where = {id(shape): i for i, shape in enumerate(distinct)}
        order = array("H" if len(distinct) < 2**16 else "L", [where[id(shape)] for shape in self._shapes])
        return (_unpickle, (tuple(shape.node for shape in distinct), order, self._values))

    @property
    def nbytes(self) -> int:
        """The bytes of its own columns (the shapes' tuple and the array), the shared shapes not counted."""
        return self._values.itemsize * len(self._values) + 8 * len(self._shapes)


_SHAPES: dict[Node, Shape] = {}  # every distinct shape once per process (at most MAX_SHAPES; then started over)
MAX_SHAPES = 65536


def pack(items: Sequence[T]) -> PackedList[T] | Sequence[T]:
    """`items` as a PackedList, or `items` itself when one of them holds something it cannot rebuild."""
    if isinstance(items, PackedList):
        return items
    values: list[float] = []
    try:
        shapes = tuple(_shape(_node(item, values)) for item in items)
    except Unpackable:
        return items
    return PackedList(shapes, array("d", values))  # its exact size (an appended array keeps spare room)


def _shape(node: Node) -> Shape:
    shape = _SHAPES.get(node)
    if shape is None:
        if len(_SHAPES) >= MAX_SHAPES:  # a long session of many jobs: the lists made so far keep their own
            _SHAPES.clear()
        shape = _SHAPES[node] = _compile(node)
    return shape


def _unpickle(nodes: tuple[Node, ...], order: array[int], values: array[float]) -> PackedList[Any]:
    shapes = [_shape(node) for node in nodes]
    return PackedList(tuple(shapes[i] for i in order), values)


# the commonest nodes as one object each, so that a pickled shape names them once (pickle's memo is by identity)
_FLOAT, _INT, _NONE = ("f",), ("i",), ("c", type(None), None)
_ZERO_FLOAT, _ZERO_INT = ("c", float, 0.0), ("c", int, 0)


def _node(value: Any, values: list[float]) -> Node:
    """`value`'s shape; its numbers appended to `values` in the order the shape's builder reads them."""
    t = type(value)
    if t is float:
        if value == 0.0 and math.copysign(1.0, value) > 0:
            return _ZERO_FLOAT
        values.append(value)
        return _FLOAT
    if t is int:
        if value == 0:
            return _ZERO_INT
        if not -_EXACT < value < _EXACT:
            return ("c", int, value)
        values.append(float(value))
        return _INT
    if value is None:
        return _NONE
    if t is bool or t is str:
        return ("c", t, value)  # the type, so that True and 1 (equal, one hash) stay two shapes
    if t is dict:
        return ("m", tuple(value), tuple(_node(v, values) for v in value.values()))
    if t is list or t is tuple:
        return ("l" if t is list else "t", tuple(_node(v, values) for v in value))
    return ("d", t, tuple(_node(getattr(value, name), values) for name in _field_names(t)))


_FIELDS: dict[type, tuple[str, ...]] = {}  # a frozen dataclass's fields, in order, once per class


def _field_names(t: type) -> tuple[str, ...]:
    """The fields of a frozen dataclass whose fields are all set by its constructor; else Unpackable."""
    names = _FIELDS.get(t)
    if names is None:
        names = _FIELDS[t] = _checked_fields(t)
    return names


def _checked_fields(t: type) -> tuple[str, ...]:
    params = getattr(t, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise Unpackable(t.__name__)
    fields = dataclasses.fields(t)
    if not all(f.init for f in fields):
        raise Unpackable(t.__name__)
    return tuple(f.name for f in fields)


def _compile(node: Node) -> Shape:
    """A Shape for `node`: its builder is one generated expression (`k0(step=v[i], collectives={k1: ...}, ...)`),
    so rebuilding an item costs one call per object in it, not a walk over its shape. A frozen object with no
    numbers in it (an empty `Split`, a `Copies` of nothing) is one object, shared by every item of the shape:
    nothing to rebuild, and the JSON writer writes its text once (report/json.py)."""
    names: dict[str, Any] = {}
    width = 0

    def const(value: Any) -> str:
        name = f"k{len(names)}"
        names[name] = value
        return name

    def expr(n: Node) -> str:
        nonlocal width
        tag = n[0]
        if tag == "f":
            width += 1
            return f"v[i + {width - 1}]"
        if tag == "i":
            width += 1
            return f"int(v[i + {width - 1}])"
        if tag == "c":
            return const(n[2])
        if tag == "m":
            return "{" + "".join(f"{const(k)}: {expr(c)}, " for k, c in zip(n[1], n[2], strict=True)) + "}"
        if tag in ("l", "t"):
            items = "".join(f"{expr(c)}, " for c in n[1])
            return f"[{items}]" if tag == "l" else f"({items})"
        # "d": the dataclass, by keyword; one without numbers is built once and shared by every item (an empty Split)
        start = width
        call = (
            f"{const(n[1])}({', '.join(f'{name}={expr(c)}' for name, c in zip(_field_names(n[1]), n[2], strict=True))})"
        )
        if width == start:
            return const(eval(call, {"int": int, **names}))  # our own source: names only, no numbers
        return call

    body = expr(node)
    code = f"def build(v, i):\n    return {body}\n"
    scope: dict[str, Any] = {"int": int, **names}
    exec(compile(code, "<overlapcheck.packed shape>", "exec"), scope)  # our own source: names and indices only
    return Shape(node, width, scope["build"])
