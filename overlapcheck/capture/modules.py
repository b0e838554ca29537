"""Module annotations: the module each DeepSpeed hook serves, named in the trace (analysis/modules.py reads them).

At engine creation every submodule and parameter of the model is tagged with its module's path
(`named_modules`), and two DeepSpeed methods are wrapped, class-wide, so that while the profiler records they
run inside a profiler range naming that module (`_RecordFunctionFast`, a cpu_op, where torch has it; else
`record_function`, a user_annotation):

- `PartitionedParameterCoordinator.fetch_sub_module(self, current_submodule, forward)` (deepspeed/runtime/zero/
  partitioned_param_coordinator.py, 0.10 to 0.19; called by the pre-forward and pre-backward hooks): the
  all-gathers it issues are on behalf of `current_submodule` -> `overlapcheck.module: <path> (<class>)`;
- its private `__all_gather_params(self, params, forward)`, which issues one gather for `params` (the module's
  own, or those it prefetches): the modules whose parameters it fetches ->
  `overlapcheck.params: <path> (<class>); <path> (<class>)`;
- `reduce_ready_partitions_and_remove_grads(self, param, ...)` of the ZeRO optimizer (stage3.py and
  stage_1_and_2.py; the gradient hook that fills the reduce buckets) -> `overlapcheck.grad: <path> (<class>)`.

Outside the profiler window a wrapped call costs one function call and one flag test; inside, one
record_function range per hook call (docs/capture.md, Module annotations, for the measured cost). Any failure
leaves DeepSpeed as it was: the annotations are an extra, never a reason to stop the job.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

MODULE_PREFIX = "overlapcheck.module: "
PARAMS_PREFIX = "overlapcheck.params: "  # labels joined by SEPARATOR: the modules whose parameters are gathered
GRAD_PREFIX = "overlapcheck.grad: "
SEPARATOR = "; "
MAX_LABELS = 64  # modules named in one params range (a bigger gather is named by its first ones, and a count)
_TAG = "_overlapcheck_module"
_PATCHED = "_overlapcheck_annotated"


def label(path: str, cls: str) -> str:
    return f"{path} ({cls})"


def tag_model(model: Any) -> int:
    """Tag each submodule and parameter of `model` with its module's label; the root is named by its class.
    Returns how many modules were tagged."""
    root = type(model).__name__
    n = 0
    for name, module in model.named_modules():
        text = label(name or root, type(module).__name__)
        object.__setattr__(module, _TAG, text)  # not nn.Module.__setattr__: a plain attribute, no registration
        for param in module.parameters(recurse=False):
            setattr(param, _TAG, text)
        n += 1
    return n


def _wrap(cls: type, method: str, prefix: str, target: Callable[..., Any]) -> bool:
    """Wrap `cls.method` so that, while the profiler records, it runs inside a range named `prefix` +
    `target(*args)` (a label, or None: no range). False when the class has no such method or it is wrapped
    already."""
    original = cls.__dict__.get(method)
    if original is None or getattr(original, _PATCHED, False):
        return False
    import torch

    enabled = torch._C._autograd._profiler_enabled  # the profiler's own state: True while it records
    record: Any
    try:  # torch >= 2.2: a range without the dispatcher round trip (5-10 µs here, against 50 for record_function)
        from torch._C._profiler import _RecordFunctionFast

        record = _RecordFunctionFast  # a cpu_op range
    except ImportError:
        record = torch.profiler.record_function  # a user_annotation range

    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if enabled():
            try:
                text = target(*args, **kwargs)
            except Exception:  # noqa: BLE001 - an unexpected signature: no annotation
                text = None
            if text is not None:
                with record(prefix + text):
                    return original(self, *args, **kwargs)
        return original(self, *args, **kwargs)

    setattr(wrapper, _PATCHED, True)
    setattr(cls, method, wrapper)
    return True


def _first(*args: Any, **kwargs: Any) -> Any:
    return args[0] if args else next(iter(kwargs.values()), None)


def _tag_of_first(*args: Any, **kwargs: Any) -> str | None:
    """The label of the module (or of a parameter's module) given first."""
    return getattr(_first(*args, **kwargs), _TAG, None)


def _tags_of_params(*args: Any, **kwargs: Any) -> str | None:
    """The labels of the modules whose parameters are in the collection given first, in first-seen order."""
    params = _first(*args, **kwargs)
    seen: dict[str, None] = {}
    for p in params if params is not None else ():
        tag = getattr(p, _TAG, None)
        if tag is not None:
            seen.setdefault(tag, None)
    if not seen:
        return None
    labels = list(seen)
    extra = f"{SEPARATOR}... {len(labels) - MAX_LABELS} more" if len(labels) > MAX_LABELS else ""
    return SEPARATOR.join(labels[:MAX_LABELS]) + extra


def annotate(engine: Any) -> list[str]:
    """Tag the engine's model and wrap DeepSpeed's fetch and gradient hooks; the names of the methods wrapped."""
    model = getattr(engine, "module", None)
    if model is None or not hasattr(model, "named_modules"):
        return []
    tag_model(model)
    done = []
    try:
        from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator
    except ImportError:
        PartitionedParameterCoordinator = None  # noqa: N806 - a class, when DeepSpeed has it
    if PartitionedParameterCoordinator is not None:
        if _wrap(PartitionedParameterCoordinator, "fetch_sub_module", MODULE_PREFIX, _tag_of_first):
            done.append("fetch_sub_module")
        gather = "_PartitionedParameterCoordinator__all_gather_params"  # private: absent in some versions
        if _wrap(PartitionedParameterCoordinator, gather, PARAMS_PREFIX, _tags_of_params):
            done.append("__all_gather_params")
    optimizer = getattr(engine, "optimizer", None)
    for klass in type(optimizer).__mro__ if optimizer is not None else ():
        if "reduce_ready_partitions_and_remove_grads" in klass.__dict__:
            if _wrap(klass, "reduce_ready_partitions_and_remove_grads", GRAD_PREFIX, _tag_of_first):
                done.append(f"{klass.__name__}.reduce_ready_partitions_and_remove_grads")
            break
    return done
