"""Imported by the bootstrap in every process started under `overlapcheck run`.

It installs post-import hooks (nothing heavy is imported here):
- `deepspeed.runtime.engine`: wraps `DeepSpeedEngine.__init__` (to record the resolved ds_config) and
  `DeepSpeedEngine._take_model_step` (the optimizer step at a gradient-accumulation boundary, used by
  both `engine.step()` and the pipeline engine) so that each optimizer step ticks the profiler;
- `torch.optim.optimizer`: a global optimizer-step post-hook, the clock for scripts without DeepSpeed
  (the first optimizer that steps is the clock; ignored once a DeepSpeed engine exists).
The per-rank state is created lazily at the first optimizer step, so launcher processes that import
DeepSpeed or torch but never step an optimizer do nothing.
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import os
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from overlapcheck.capture.settings import CaptureSettings

_installed = False
_controller: Any = None
_lock = threading.Lock()


def install_from_env() -> bool:
    """Install the hooks when this process runs under `overlapcheck run`; True when installed."""
    global _installed
    settings = CaptureSettings.from_env(os.environ)
    if settings is None or _installed:
        return False
    _installed = True
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_forget_controller)
    callbacks = {"deepspeed.runtime.engine": _patch_engine, "torch.optim.optimizer": _patch_optimizer}
    for name, callback in callbacks.items():
        module = sys.modules.get(name)
        if module is not None:
            _safely(callback, module)
        else:
            sys.meta_path.insert(0, _PostImportFinder(name, callback))
    return True


def controller() -> Any:
    """The rank's capture controller, created at first use (None when not under `overlapcheck run`)."""
    global _controller
    with _lock:
        if _controller is None:
            settings = CaptureSettings.from_env(os.environ)
            if settings is None:
                return None
            from overlapcheck.capture.rank import RankCapture

            _controller = RankCapture(settings)
            atexit.register(_controller.at_exit)
        return _controller


def _forget_controller() -> None:
    """In a forked child: the parent's controller is the parent's rank. If the child steps an optimizer, it
    makes its own, which then finds the rank claimed (see RankCapture) and stays out of it."""
    global _controller, _lock
    _controller = None
    _lock = threading.Lock()  # the parent's may have been held at the fork


def _safely(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception as exc:  # noqa: BLE001 - never break the user's imports
        print(f"overlapcheck: capture hook disabled: {exc!r}", file=sys.stderr)


# ---- DeepSpeed ---------------------------------------------------------------------------------------


def _patch_engine(module: ModuleType) -> None:
    engine_cls = module.DeepSpeedEngine
    if getattr(engine_cls, "_overlapcheck_patched", False):
        return
    original_init = engine_cls.__init__
    original_step = engine_cls._take_model_step

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        ctl = controller()
        if ctl is not None:
            ctl.on_engine(self)

    @functools.wraps(original_step)
    def _take_model_step(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original_step(self, *args, **kwargs)
        ctl = controller()
        if ctl is not None:
            ctl.on_step("deepspeed", self)
        return result

    engine_cls.__init__ = __init__
    engine_cls._take_model_step = _take_model_step
    engine_cls._overlapcheck_patched = True


# ---- plain torch -------------------------------------------------------------------------------------


def _patch_optimizer(module: ModuleType) -> None:
    register = getattr(module, "register_optimizer_step_post_hook", None)
    if register is None:
        return

    def _after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        ctl = controller()
        if ctl is not None:
            ctl.on_step("optimizer", optimizer)

    register(_after_step)


# ---- post-import machinery ---------------------------------------------------------------------------


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds `name` with the other finders and runs `callback(module)` right after it is executed."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]):
        self.name, self.callback = name, callback
        self._searching = False

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname != self.name or self._searching:
            return None
        self._searching = True
        spec = None
        try:  # ask the other finders, so that editable installs and zip imports still work
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is not self and find is not None:
                    spec = find(fullname, path, target)
                    if spec is not None:
                        break
        finally:
            self._searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _CallbackLoader(spec.loader, self.callback)
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one module, one time
        return spec


class _CallbackLoader(importlib.abc.Loader):
    """Delegates to the real loader, then calls back; puts the real loader back on the module."""

    def __init__(self, inner: Any, callback: Callable[[ModuleType], None]):
        self._inner, self._callback = inner, callback

    def create_module(self, spec: Any) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._inner
        if module.__spec__ is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        _safely(self._callback, module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
