"""The rules, in one list each: per-rank rules (TraceModel view -> findings) and cross-rank rules (the report's
per-rank data -> findings). Order matters for the sync rules: the first rule that claims a sync owns it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from overlapcheck.diagnose.context import RankView

RankRule = Callable[[RankView], list[dict[str, Any]]]
CrossRule = Callable[[dict[str, Any], dict[str, Any] | None], list[dict[str, Any]]]

RANK_RULES: list[RankRule] = []
CROSS_RULES: list[CrossRule] = []

# rule id -> highest severity it may get (None: from its cost)
SEVERITY_CAP: dict[str, str] = {}

# DeepSpeed syncs every ZeRO-3 run has: reported only when they cost at least this much per step
INHERENT = {"epilogue-sync", "reduce-event-throttle", "fetch-throttle"}
INHERENT_MIN_US = 1.0

# rule id -> (critical, warning) cost shares of the step, for rules whose cost is partly inherent: ZeRO-3 always
# waits for the first all-gather of a pass, and prefetched gathers slower than the compute they hide behind
SEVERITY_SHARES: dict[str, tuple[float, float]] = {"cross-stream-wait": (0.15, 0.05)}

# rule id -> rules whose cost on the same rank it already explains (subtracted from theirs): the epilogue sync
# waits for exactly the reduce-scatters that the bucket and stream rules explain
CLAIMS: dict[str, tuple[str, ...]] = {
    "reduce-scatter-deferred": ("epilogue-sync",),
    "overlap-comm-disabled": ("epilogue-sync",),
    "no-stream-concurrency": ("epilogue-sync",),
    "same-communicator": ("epilogue-sync",),
}


def rank_rule(fn: RankRule) -> RankRule:
    RANK_RULES.append(fn)
    return fn


def cross_rule(fn: CrossRule) -> CrossRule:
    CROSS_RULES.append(fn)
    return fn


def load() -> None:
    """Import the rule modules (each registers its rules on import)."""
    from overlapcheck.diagnose import buckets, syncs, streams, waits, stragglers  # noqa: F401, I001
