"""Trees of frozen objects held as columns: a list of like objects as one array of numbers and, per item, a
shared shape (overlapcheck/compact.py keeps every rank's steps so, docs/scale.md).

A rank's steps are a tree of small objects (per step a `StepMetrics`, its phases, a `Split` per collective kind
and a `Copies`), about 1.35 KB a step as objects. What differs between two steps of a job is mostly their
numbers; the rest (the classes, the dicts' keys, which values are None or zero) is the step's *shape*, and a job
has a handful of shapes. `Packer.pack` splits each item into its shape, held once per job, and its numbers,
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
    """An item holds something `Packer` does not rebuild (a set, a mutable object, a dataclass with init=False
    fields): the list is kept as it is."""


@dataclasses.dataclass(frozen=True, eq=False)
class Shape:
    """One distinct shape: how many numbers an item of it takes from the array, and the function that rebuilds
    the item from them (`build(values, start)`)."""

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

    def __reduce__(self) -> tuple[Any, ...]:  # pickled (a Dask result, a copy) as the plain list it stands for
        return (list, (list(self),))

    @property
    def nbytes(self) -> int:
        """The bytes of its own columns (the shapes' tuple and the array), the shared shapes not counted."""
        return self._values.itemsize * len(self._values) + 8 * len(self._shapes)


class Packer:
    """Packs lists into PackedLists, sharing one Shape per distinct shape among every list it packs (one per
    analysis)."""

    def __init__(self) -> None:
        self._shapes: dict[Node, Shape] = {}

    def pack(self, items: Sequence[T]) -> PackedList[T] | Sequence[T]:
        """`items` as a PackedList, or `items` itself when one of them holds something it cannot rebuild."""
        if isinstance(items, PackedList):
            return items
        values: list[float] = []
        try:
            shapes = tuple(self._shape(_node(item, values)) for item in items)
        except Unpackable:
            return items
        return PackedList(shapes, array("d", values))  # its exact size (an appended array keeps spare room)

    def _shape(self, node: Node) -> Shape:
        shape = self._shapes.get(node)
        if shape is None:
            shape = self._shapes[node] = _compile(node)
        return shape


def _node(value: Any, values: list[float]) -> Node:
    """`value`'s shape; its numbers appended to `values` in the order the shape's builder reads them."""
    t = type(value)
    if t is float:
        if value == 0.0 and math.copysign(1.0, value) > 0:
            return ("c", float, 0.0)
        values.append(value)
        return ("f",)
    if t is int:
        if value == 0 or not -_EXACT < value < _EXACT:
            return ("c", int, value)
        values.append(float(value))
        return ("i",)
    if value is None or t is bool or t is str:
        return ("c", t, value)  # the type, so that True and 1 (equal, one hash) stay two shapes
    if t is dict:
        return ("m", tuple(value), tuple(_node(v, values) for v in value.values()))
    if t is list or t is tuple:
        return ("l" if t is list else "t", tuple(_node(v, values) for v in value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        params = getattr(t, "__dataclass_params__", None)
        fields = dataclasses.fields(value)
        if params is None or not params.frozen or not all(f.init for f in fields):
            raise Unpackable(t.__name__)
        return ("d", t, tuple(_node(getattr(value, f.name), values) for f in fields))
    raise Unpackable(t.__name__)


def _compile(node: Node) -> Shape:
    """A Shape for `node`: its builder is one generated expression (`C0(v[i], {'all': C1(...)}, ...)`), so
    rebuilding an item costs one call per object in it, not a walk over its shape."""
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
        fields = dataclasses.fields(n[1])  # "d": the dataclass, by keyword (fields in the order packed)
        return f"{const(n[1])}({', '.join(f'{f.name}={expr(c)}' for f, c in zip(fields, n[2], strict=True))})"

    body = expr(node)
    code = f"def build(v, i):\n    return {body}\n"
    scope: dict[str, Any] = {"int": int, **names}
    exec(compile(code, "<overlapcheck.packed shape>", "exec"), scope)  # our own source: names and indices only
    return Shape(width, scope["build"])
