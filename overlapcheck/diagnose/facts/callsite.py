"""Who issued a CPU-side call: the `python_function` stack (with_stack=True) or, without stacks, the enclosing
`cpu_op`s / `user_annotation`s on the same thread.

A frame name looks like `deepspeed/runtime/zero/stage3.py(1667): __reduce_and_partition_ipg_grads` (the path
may be absolute). The call site of a sync is the innermost frame that is DeepSpeed or user code, skipping
DeepSpeed's plumbing (accelerator wrappers, nvtx decorators) so that the site names the function that decided
to synchronize.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from functools import lru_cache

import numpy as np

from overlapcheck.trace.model import PYTHON, TraceModel

_FRAME = re.compile(r"^(?P<file>.*?\.py)\((?P<line>\d+)\): (?P<func>.+)$")
_LIBRARY = re.compile(
    r"(^|/)(torch|torchvision|numpy|transformers|accelerate|apex|triton|collections|contextlib|"
    r"threading|importlib|functools|typing|abc|enum)/|site-packages/(?!deepspeed)|dist-packages/"
    r"(?!deepspeed)|/lib/python3\.\d+/(?!site-packages)|^<"
)
_DS_PLUMBING = re.compile(r"deepspeed/(accelerator/|utils/nvtx\.py|runtime/compiler\.py|utils/debug\.py)")


@lru_cache(maxsize=1 << 16)
def parse_frame(name: str) -> tuple[str, int, str] | None:
    """(file, line, function) of a python_function name, None for built-ins and module frames (memoized: a
    trace has few distinct frames, seen at many times)."""
    m = _FRAME.match(name)
    return (m.group("file"), int(m.group("line")), m.group("func")) if m else None


def short_file(path: str) -> str:
    """`/opt/x/site-packages/deepspeed/runtime/zero/stage3.py` -> `deepspeed/runtime/zero/stage3.py`."""
    i = path.rfind("deepspeed/")
    return path[i:] if i >= 0 else path.rsplit("site-packages/", 1)[-1]


def is_deepspeed(name: str) -> bool:
    return "deepspeed/" in name and parse_frame(name) is not None


def is_user(name: str) -> bool:
    """Application code: a Python frame that belongs to no library."""
    return parse_frame(name) is not None and "deepspeed/" not in name and not _LIBRARY.search(name)


def is_site(name: str) -> bool:
    """A frame worth naming as a call site: user code, or DeepSpeed outside its plumbing."""
    return is_user(name) or (is_deepspeed(name) and not _DS_PLUMBING.search(name))


class CallSites:
    """Stacks of CPU scopes per thread, queried by (thread, time)."""

    def __init__(self, model: TraceModel, names: np.ndarray):
        self.model = model
        self.names = names
        o = model.ops
        self.has_stacks = bool(len(o)) and bool((o.kind == PYTHON).any())
        self._threads: dict[tuple[int, bool], tuple[array, array, array, array]] = {}
        self._sites: dict[tuple[bool, tuple[int, ...]], tuple[object, list[str]]] = {}

    def _nesting(self, thread: int, python: bool) -> tuple[array, array, array, array]:
        """Scopes of one thread sorted by start (outer first on ties): interned names, starts, ends and each
        one's parent index (flat `array`s: 8 bytes an element, and the queries read them one at a time)."""
        key = (thread, python)
        if key not in self._threads:
            o = self.model.ops
            sel = (o.thread == thread) & ((o.kind == PYTHON) if python else (o.kind != PYTHON))
            idx = np.flatnonzero(sel)
            idx = idx[np.lexsort((-o.end[idx], o.start[idx]))]
            starts, ends = _flat("d", o.start[idx]), _flat("d", o.end[idx])
            parents = _flat("q", np.full(len(idx), -1))
            stack: list[int] = []
            for k, s in enumerate(starts):  # one pass; scopes of one thread nest
                while stack and ends[stack[-1]] <= s:
                    stack.pop()
                if stack:
                    parents[k] = stack[-1]
                stack.append(k)
            self._threads[key] = (_flat("q", o.name[idx]), starts, ends, parents)
        return self._threads[key]

    def stack(self, thread: int, t: float, python: bool = True) -> list[str]:
        """Names of the scopes enclosing time t on a thread, innermost first."""
        return [str(self.names[n]) for n in self._open(thread, t, python)]

    def _open(self, thread: int, t: float, python: bool) -> tuple[int, ...]:
        """Interned names of the scopes enclosing time t on a thread, innermost first."""
        names, start, end, parent = self._nesting(thread, python)
        k = bisect_right(start, t) - 1
        # the open scopes at t are the latest-starting scope before t and its ancestors, minus closed ones
        while k >= 0 and end[k] <= t:
            k = parent[k]
        out: list[int] = []
        while k >= 0:
            out.append(names[k])
            k = parent[k]
        return tuple(out)

    def site(self, thread: int, t: float) -> dict[str, object]:
        """The call site of a call at time t on a thread: `frame` (innermost DeepSpeed/user frame, or the
        enclosing ops without stacks) and `stack` (DeepSpeed and user frames, innermost first)."""
        if self.has_stacks:
            frames = self._open(thread, t, python=True)
            if frames:
                frame, stack = self._site(True, frames)
                return {"frame": frame, "stack": list(stack)}
        frame, stack = self._site(False, self._open(thread, t, python=False))
        return {"frame": frame, "stack": list(stack)}

    def _site(self, python: bool, scopes: tuple[int, ...]) -> tuple[object, list[str]]:
        """`site`'s frame and stack for one stack of interned scope names (memoized per distinct stack)."""
        key = (python, scopes)
        if key not in self._sites:
            names = [str(self.names[n]) for n in scopes]
            if python:
                useful = [f for f in names if is_deepspeed(f) or is_user(f)]
                site = next((f for f in names if is_site(f)), useful[0] if useful else names[0])
                self._sites[key] = (short_frame(site), [short_frame(f) for f in useful[:12]])
            else:
                # nor overlapcheck run's module ranges (capture/modules.py): one call site, whichever module's hook
                ops = [op for op in names if not op.startswith(("ProfilerStep#", "overlapcheck."))]
                self._sites[key] = (" < ".join(ops[:3]) if ops else None, ops[:12])
        return self._sites[key]


def _flat(typecode: str, values: np.ndarray) -> array:
    """A numpy column as a flat `array` ("d": float64, "q": int64), which Python reads one element at a time
    several times faster than a numpy array, for the same 8 bytes an element."""
    return array(typecode, values.astype(np.float64 if typecode == "d" else np.int64).tobytes())


def short_frame(frame: str) -> str:
    """`/opt/x/site-packages/deepspeed/a.py(12): f` -> `deepspeed/a.py(12): f` (other names as they are)."""
    parsed = parse_frame(frame)
    if parsed is None:
        return frame
    file, line, func = parsed
    return f"{short_file(file)}({line}): {func}"


def functions(stack: list[str]) -> set[str]:
    """Function names on a stack of frames (`fetch_sub_module`, `__reduce_and_partition_ipg_grads`, ...)."""
    return set(_functions(tuple(stack)))


@lru_cache(maxsize=1 << 12)
def _functions(stack: tuple[str, ...]) -> frozenset[str]:
    out = set()
    for f in stack:
        parsed = parse_frame(f)
        if parsed:
            out.add(parsed[2])
            out.add(f"{short_file(parsed[0]).rsplit('/', 1)[-1]}:{parsed[2]}")
    return frozenset(out)
