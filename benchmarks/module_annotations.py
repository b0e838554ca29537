"""What the module annotations of `overlapcheck run` cost per hook call (capture/modules.py), outside and inside
the profiler window: a method wrapped as DeepSpeed's fetch and gradient hooks are, against the same method
unwrapped; and what `with_stack` + `with_modules` (`run --with-modules`) cost per module call inside the window.

    python -m benchmarks.module_annotations [--calls 20000]

Not a test: timings on a shared machine are noisy; the median of 5 rounds is printed. docs/capture.md quotes it.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from overlapcheck.capture.modules import MODULE_PREFIX, _tag_of_first, _wrap, tag_model


class _Hooks:
    def fetch_sub_module(self, module, forward=True):  # the work of a real hook is not what is measured
        return module


def _per_call(fn, calls: int) -> float:
    rounds = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(rounds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20000)
    args = parser.parse_args()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8))
    tag_model(model)
    plain = _Hooks()
    bare = _per_call(lambda: plain.fetch_sub_module(model), args.calls)

    class Wrapped(_Hooks):
        pass

    Wrapped.fetch_sub_module = _Hooks.fetch_sub_module  # type: ignore[method-assign]
    _wrap(Wrapped, "fetch_sub_module", MODULE_PREFIX, _tag_of_first)
    hooks = Wrapped()
    outside = _per_call(lambda: hooks.fetch_sub_module(model), args.calls)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        inside_plain = _per_call(lambda: plain.fetch_sub_module(model), args.calls)
        inside = _per_call(lambda: hooks.fetch_sub_module(model), args.calls)
    x = torch.randn(1, 8)
    with torch.no_grad():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            module_plain = _per_call(lambda: model(x), args.calls // 10)
        with torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True, with_modules=True
        ):
            module_stack = _per_call(lambda: model(x), args.calls // 10)
    print(f"hook call, unwrapped: {bare:.2f} us")
    print(f"hook call, wrapped, profiler off (outside the window): +{outside - bare:.2f} us")
    print(f"hook call, wrapped, profiler on (inside the window): +{inside - inside_plain:.2f} us (one range)")
    print(f"module call in the window: {module_plain:.1f} us; with_stack+with_modules: {module_stack:.1f} us")


if __name__ == "__main__":
    main()
