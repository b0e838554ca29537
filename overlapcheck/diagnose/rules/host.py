"""Exposed communication that runs while the GPU waits for a host that launches too slowly (host-bound launch).

Precondition: the compute stream has host-starved windows (facts/hoststarved.py: a gap that ends when the host
launched the next activity, which started at once; no sync the host waited in, no stream wait) whose compute idle
is at least MIN_IDLE_SHARE of the step. Cost: the exposed communication inside those windows that no finding of a
more specific rule covers (it runs after every `find` rule, on what they left: one exposed µs is charged once, so
a host sync, an on-demand gather or a bucket rule keeps what it explains). Fix: none in the ds_config; the text
names what shortens the host's time per layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts.coverage import Coverage
from overlapcheck.diagnose.facts.hoststarved import host_starved
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.finding import finding
from overlapcheck.diagnose.locators import exposed_blames
from overlapcheck.diagnose.rule import Rule
from overlapcheck.model import Finding

# compute idle in host-starved windows below this share of the step is launch jitter, not a host that is behind:
# a job whose host keeps ahead of its GPU queues the next kernels long before the previous ones end, and the
# few gaps it has (the first kernels after a sync) are the sync rules'; one share point is the order of the
# step-to-step variation of a steady step (the critical/warning shares are 10 and 3 points)
MIN_IDLE_SHARE = 0.01
DRIVER_SHARE = 0.5  # runtime calls that spend at least this share of the windows' host side: the driver's time
DEEPSPEED_HOOKS = ("fetch_sub_module", "pre_sub_module_forward", "post_sub_module", "_pre_forward", "_post_backward")


def host_bound_launch(view: RankFacts, cov: Coverage) -> list[Finding]:
    """One finding for the exposed communication the rank's host-starved windows hold (module docstring)."""
    hs = host_starved(view)
    n = view.n_steps
    if not len(hs.windows) or hs.idle_us / n < MIN_IDLE_SHARE * view.step_time_us:
        return []
    covers = iv.intersect(hs.windows, cov.unexplained)
    cost = iv.length(covers) / n
    if cost <= 0:
        return []
    frames = [(name, round(us / n, 3)) for name, us in hs.frames]
    calls = [(name, round(us / n, 3)) for name, us in hs.calls]
    in_calls = sum(us for _, us in hs.calls)
    hooks = any(h in name for name, _ in frames for h in DEEPSPEED_HOOKS)
    evidence: dict[str, Any] = {
        "starved_windows_per_step": round(len(hs.rows) / n, 2),
        "starved_compute_idle_us_per_step": round(hs.idle_us / n, 3),
        "median_window_us": round(float(np.median(hs.windows.ends - hs.windows.starts)), 3),
        "host_frames_us_per_step": [{"frame": name, "us": us} for name, us in frames],
        "host_side_us_per_step": round(hs.host_us / n, 3),
        "runtime_calls_us_per_step": [{"call": name, "us": us} for name, us in calls],
    }
    where = f" (most of it in {frames[0][0]})" if frames else ""
    why = (
        f"the compute stream idles {hs.idle_us / n / 1000:.2f} ms per step in {len(hs.rows) / n:.0f} gaps where "
        f"the previous kernel had ended before the host launched the next one{where}, with no sync or stream "
        "wait behind them: the GPU waits for the CPU, and the communication that runs meanwhile is exposed by "
        "the host's pace, not by its own size or schedule. No ds_config key changes how fast the host launches; "
        "shorten its time per layer: compile the layers (torch.compile, or DeepSpeed's engine.compile()) to fuse "
        "small kernels and cut Python and dispatcher overhead, remove Python work from the step (per-step "
        "logging, .item() in loops, Python-side loops over parameters), or give each launch more work (a larger "
        "micro-batch); CUDA graphs remove launch overhead only where ZeRO-3's hooks do not run inside the "
        "captured region. The profiler itself slows the host (with_stack, record_shapes and profile_memory add "
        "per-op overhead): confirm the gaps in a capture without them"
    )
    if calls and in_calls >= DRIVER_SHARE * hs.host_us:
        why += (
            f"; most of the host's time there is inside CUDA runtime calls ({calls[0][0]} "
            f"{calls[0][1] / 1000:.2f} ms per step), which do not wait for this GPU: the driver is slow to return "
            "(contention for it with another thread, e.g. NCCL's, or the host's CPU load), not the Python"
        )
    if hooks:
        why += (
            "; DeepSpeed's per-module hooks spend part of it: stage3_module_granularity_threshold (DeepSpeed "
            "0.16+) groups fine-grained modules so fewer hooks run"
        )
    return [
        finding(
            HOST_BOUND_LAUNCH.id,
            "The host launches work slower than the GPU runs it",
            why,
            cost,
            [view.rank_id],
            view.steps_of_rows(hs.rows),
            evidence,
            covers=covers,
        )
    ]


# after every `find` rule, on the exposed communication their findings leave uncovered, before
# unexplained-exposure takes the rest
HOST_BOUND_LAUNCH = Rule("host-bound-launch", residual=host_bound_launch, blame=exposed_blames)
