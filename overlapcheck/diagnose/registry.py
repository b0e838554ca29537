"""Every rule, in one ordered list. A per-rank rule reads one rank's facts (`RankFacts`) and returns findings; a
cross-rank rule reads every rank's result. Order matters only where rules share costs (`explains`) and for
the order of equal-cost findings. docs/rules.md describes each rule; to add one, write its function in a
module of `rules/` and list it here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from overlapcheck.diagnose.facts.coverage import Coverage
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.rules import bandwidth, buckets, exposure, stragglers, streams, syncs, waits
from overlapcheck.job import JobContext
from overlapcheck.model import Finding, RankResult

RankRule = Callable[[RankFacts], list[Finding]]
CrossRule = Callable[[Sequence[RankResult], JobContext], list[Finding]]
ResidualRule = Callable[[RankFacts, Coverage], list[Finding]]

CRITICAL_SHARE = 0.10  # cost / step time at or above which a finding is critical
WARNING_SHARE = 0.03
INHERENT_MIN_US = 1.0  # an inherent rule's finding is reported only from this cost per step


@dataclass(frozen=True)
class Rule:
    """One rule: its id (the findings' `rule`), its function, and how its findings are weighed. The function is
    one of `find` (per rank, on its facts), `residual` (per rank, after every `find` rule, on the exposed
    communication their findings leave uncovered) or `cross` (across ranks, on every rank's result).

    - `severity_cap`: the highest severity its findings may get (None: from the cost alone);
    - `inherent`: every ZeRO-3 run has this cause; its findings are kept only from INHERENT_MIN_US per step;
    - `shares`: the (critical, warning) shares of the step for its severity;
    - `explains`: rules whose cost this rule's findings already explain (subtracted there: on the same rank for a
      per-rank rule, from the merged findings for a cross-rank rule);
    - `limit`: its findings describe a limit of the hardware (the transfer itself outruns the compute), not a
      cause to remove: ranked after the causes;
    - `distinct_by`: evidence fields that tell two findings of this rule apart (one per call site, per
      collective); findings of the same rule on several ranks merge when these fields agree.
    """

    id: str
    find: RankRule | None = None
    cross: CrossRule | None = None
    residual: ResidualRule | None = None
    severity_cap: str | None = None
    inherent: bool = False
    shares: tuple[float, float] = (CRITICAL_SHARE, WARNING_SHARE)
    explains: tuple[str, ...] = ()
    distinct_by: tuple[str, ...] = ()
    limit: bool = False


RULES: tuple[Rule, ...] = (
    Rule("reduce-scatter-deferred", buckets.reduce_scatter_deferred, explains=("epilogue-sync",)),
    Rule("overlap-comm-disabled", buckets.overlap_comm_disabled, explains=("epilogue-sync",)),
    Rule("tiny-collectives", buckets.tiny_collectives, severity_cap="warning"),
    Rule("comms-logger-sync", syncs.owned_by("comms-logger-sync")),
    Rule("throughput-timer-sync", syncs.owned_by("throughput-timer-sync")),
    Rule("offload-blocking-copy", syncs.owned_by("offload-blocking-copy")),
    Rule("reduce-event-throttle", syncs.owned_by("reduce-event-throttle"), inherent=True),
    Rule("fetch-throttle", syncs.owned_by("fetch-throttle"), inherent=True),
    # the last bucket is always exposed; reduce-scatter-deferred owns big ones
    Rule("epilogue-sync", syncs.owned_by("epilogue-sync"), severity_cap="info", inherent=True),
    Rule("host-sync", syncs.owned_by("host-sync"), distinct_by=("calls", "call_site")),
    Rule("same-communicator", streams.same_communicator, explains=("epilogue-sync",)),
    Rule("no-stream-concurrency", streams.no_stream_concurrency, explains=("epilogue-sync",)),
    Rule("allgather-not-prefetched", waits.allgather_not_prefetched),
    # ZeRO-3 always waits for the first all-gather of a pass, and for prefetched gathers slower than the
    # compute they hide behind: a wait is partly inherent, so it needs a larger share to matter
    # the transfer itself outruns the compute beside it: no schedule fix; bandwidth-bound owns it when it dominates
    Rule("allgather-transfer-bound", waits.allgather_transfer_bound, severity_cap="info", limit=True),
    Rule("cross-stream-wait", waits.cross_stream_waits, shares=(0.15, 0.05), distinct_by=("waited_for", "call_site")),
    # the other ranks' waits inside collectives for the straggler stall their compute: those stalls are its
    Rule("straggler", cross=stragglers.straggler, explains=("cross-stream-wait", "allgather-transfer-bound")),
    # the floor no schedule could hide at the measured bandwidth (docs/rules.md)
    Rule(
        "bandwidth-bound", cross=bandwidth.bandwidth_bound, explains=("cross-stream-wait", "allgather-transfer-bound")
    ),
    # after every per-rank rule, on the exposed communication their findings leave uncovered (facts/coverage.py)
    Rule("unexplained-exposure", residual=exposure.unexplained_exposure, severity_cap="warning"),
)

BY_ID = {rule.id: rule for rule in RULES}
