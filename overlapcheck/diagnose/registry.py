"""Every rule, in one ordered list. A per-rank rule reads one rank's facts (`RankFacts`) and returns findings; a
cross-rank rule reads every rank's result. Order matters only where rules share costs (`explains`) and for
the order of equal-cost findings. docs/rules.md describes each rule; to add one, build its `Rule` in a module of
`rules/` (diagnose/rule.py says what a rule carries) and list it here.
"""

from __future__ import annotations

from overlapcheck.diagnose.rule import Rule
from overlapcheck.diagnose.rules import (
    bandwidth,
    buckets,
    dtypes,
    exposure,
    host,
    reduction,
    stragglers,
    streams,
    syncs,
    waits,
)

INHERENT_MIN_US = 1.0  # an inherent rule's finding is reported only from this cost per step

RULES: tuple[Rule, ...] = (
    buckets.DEFERRED,
    buckets.OVERLAP_COMM_DISABLED,
    buckets.TINY_COLLECTIVES,
    buckets.SMALL_REDUCTIONS,
    dtypes.FP32_COMMUNICATION,
    reduction.GRADIENT_ALLREDUCE,
    syncs.COMMS_LOGGER,
    syncs.THROUGHPUT_TIMER,
    syncs.OFFLOAD_COPY,
    syncs.PARAM_OFFLOAD,
    syncs.REDUCE_THROTTLE,
    syncs.FETCH_THROTTLE,
    syncs.EPILOGUE,
    syncs.HOST_SYNC,
    streams.SAME_COMMUNICATOR,
    streams.NO_STREAM_CONCURRENCY,
    waits.NOT_PREFETCHED,
    waits.WARM_UP,
    waits.TRANSFER_BOUND,
    buckets.REDUCE_TRANSFER_BOUND,
    waits.CROSS_STREAM_WAIT,
    stragglers.STRAGGLER,
    stragglers.SLOW_NODE,
    bandwidth.BANDWIDTH_BOUND,
    exposure.PEER_WAIT,
    host.HOST_BOUND_LAUNCH,
    exposure.UNEXPLAINED,
)

BY_ID = {rule.id: rule for rule in RULES}
LIMITS = frozenset(rule.id for rule in RULES if rule.limit)
