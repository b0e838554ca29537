"""A selection of numbers (`--steps 5:7`, `--ranks 0-3,8`) held as ranges, never expanded: `--ranks
0-999999,2000000-2999999,...` costs a few tuples, not millions of integers. Imports no stage."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Set
from dataclasses import dataclass
from itertools import islice

from overlapcheck.errors import UserError

MAX_NUMBER = 2**63 - 1  # a step or rank number beyond int64 names none there is
MAX_PARTS = 10_000


class Numbers(Set[int]):
    """Sorted, disjoint, non-adjacent inclusive ranges: a set of ints (`n in numbers` is a bisection, `==` a
    set's) that is never expanded."""

    __slots__ = ("ranges",)

    def __init__(self, ranges: tuple[tuple[int, int], ...] = ()):
        self.ranges = ranges

    def __repr__(self) -> str:
        return f"Numbers({self.text()!r})"

    __hash__ = Set._hash

    @classmethod
    def of(cls, numbers: Iterable[int]) -> Numbers:
        return cls.from_ranges((n, n) for n in numbers)

    @classmethod
    def from_ranges(cls, ranges: Iterable[tuple[int, int]]) -> Numbers:
        merged: list[tuple[int, int]] = []
        for lo, hi in sorted(ranges):
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        return cls(tuple(merged))

    def __contains__(self, value: object) -> bool:
        if isinstance(value, bool) or not isinstance(value, int):
            return False
        lo, hi = 0, len(self.ranges)
        while lo < hi:
            mid = (lo + hi) // 2
            if self.ranges[mid][1] < value:
                lo = mid + 1
            else:
                hi = mid
        return lo < len(self.ranges) and self.ranges[lo][0] <= value

    def __len__(self) -> int:
        return self.count  # OverflowError beyond sys.maxsize (0-9223372036854775807): ask `count` first

    @property
    def count(self) -> int:
        """How many numbers, as a Python int (any size: `len` stops at 2^63-1)."""
        return sum(hi - lo + 1 for lo, hi in self.ranges)

    def __iter__(self) -> Iterator[int]:
        for lo, hi in self.ranges:
            yield from range(lo, hi + 1)

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def text(self, dash: str = "-") -> str:
        """'0-3,8' (as `format_numbers` writes a set)."""
        return ",".join(str(lo) if lo == hi else f"{lo}{dash}{hi}" for lo, hi in self.ranges)


def how_many(numbers: Set[int]) -> int:
    """How many numbers `numbers` holds, a Numbers of every int64 included."""
    return numbers.count if isinstance(numbers, Numbers) else len(numbers)


def parse_numbers(text: str, dash: str, option: str) -> Numbers:
    """'5:7' or '5,6' (--steps, dash ':'), '0-3,8' (--ranks, dash '-'): the numbers, ranges inclusive.
    UserError (one line naming `option`) for anything else, a number beyond int64 among them."""
    parts = text.split(",")
    if len(parts) > MAX_PARTS:
        raise UserError(f"{option}: more than {MAX_PARTS} parts; write ranges (N{dash}M)")
    ranges: list[tuple[int, int]] = []
    for raw in parts:
        part = raw.strip()
        lo, sep, hi = part.partition(dash)
        shown = part if len(part) <= 40 else part[:37] + "..."
        if not _digits(lo) or (sep and not _digits(hi)):
            raise UserError(f"{option}: {shown!r} is not N or N{dash}M (non-negative whole numbers)")
        if len(lo.strip()) > 19 or len(hi.strip()) > 19 or max(int(lo), int(hi) if sep else 0) > MAX_NUMBER:
            raise UserError(f"{option}: {shown!r} is beyond any {option.strip('-')[:-1]} number (at most 2^63-1)")
        a = int(lo)
        b = int(hi) if sep else a
        if b < a:
            raise UserError(f"{option}: {shown!r} is an empty range ({b} < {a})")
        ranges.append((a, b))
    return Numbers.from_ranges(ranges)


def _digits(text: str) -> bool:
    t = text.strip()
    return t.isascii() and t.isdigit()


@dataclass(frozen=True)
class Caller:
    """Who made a selection, so that an error names it as that caller wrote it: the command line's options
    (`--ranks 0-3`, `--steps 5:7`, `--rank-from 'gpu(\\d+)'`) or the API's parameters (`ranks=[0, 1, 2, 3]`,
    `steps=[5, 6, 7]`, `rank_from='gpu(\\d+)'`). The checks are the same for both (pipeline.analyze_inputs)."""

    api: bool = False

    def numbers(self, what: str, numbers: Set[int]) -> str:
        """'--ranks 0-3' / 'ranks=[0, 1, 2, 3]' (`what`: "ranks" or "steps"); a long selection is not expanded."""
        held = numbers if isinstance(numbers, Numbers) else Numbers.of(numbers)
        if not self.api:
            return f"--{what} {held.text(':' if what == 'steps' else '-')}"
        first = [str(n) for n in islice(held, 11)]
        if len(first) <= 10:
            return f"{what}=[{', '.join(first)}]"
        return f"{what}=[{', '.join(first[:10])}, ...] ({held.text()})"

    def option(self, name: str) -> str:
        """'--ds-config' / 'ds_config=' (`name`: the parameter's name)."""
        return f"{name}=" if self.api else f"--{name.replace('_', '-')}"

    def pattern(self, pattern: str) -> str:
        """`--rank-from 'gpu(\\d+)'` / `rank_from=r'gpu(\\d+)'`: as typed in a shell or in Python, backslashes single
        where that is exact (else Python's repr, which keeps a message on one line)."""
        plain = pattern.isprintable() and "'" not in pattern
        if not self.api:
            return f"--rank-from '{pattern}'" if plain else f"--rank-from {pattern!r}"
        if plain and "\\" in pattern and not pattern.endswith("\\"):
            return f"rank_from=r'{pattern}'"
        return f"rank_from={pattern!r}"


CLI = Caller()
API = Caller(api=True)
