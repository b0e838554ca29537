"""What a rule is: one object that carries everything about it. Rule modules (`diagnose/rules/`) build their
`Rule`s; `diagnose/registry.py` lists them in order; nothing else names a rule's id."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from overlapcheck.diagnose.facts.coverage import Coverage
    from overlapcheck.diagnose.facts.hostsyncs import Origin
    from overlapcheck.diagnose.facts.job import JobFacts
    from overlapcheck.diagnose.facts.view import RankFacts
    from overlapcheck.model import Blame, Finding

RankRule = Callable[["RankFacts"], "list[Finding]"]
CrossRule = Callable[["JobFacts"], "list[Finding]"]
ResidualRule = Callable[["RankFacts", "Coverage"], "list[Finding]"]
Locator = Callable[["RankFacts", "list[tuple[Rule, Finding]]"], "list[Blame]"]

GPU_FACTS = "GPU streams, kernels and CUDA runtime calls"  # what most rules read, and CPU-only traces lack
CRITICAL_SHARE = 0.10  # cost / step time at or above which a finding is critical
WARNING_SHARE = 0.03


@dataclass(frozen=True)
class Rule:
    """One rule: its id (the findings' `rule`), its function, how its findings are weighed, and where they happen.
    The function is one of `find` (per rank, on its facts), `residual` (per rank, after every `find` rule, on the
    exposed communication their findings leave uncovered) or `cross` (across ranks, on every rank's result).

    - `severity_cap`: the highest severity its findings may get (None: from the cost alone);
    - `inherent`: every ZeRO-3 run has this cause; its findings are kept only from INHERENT_MIN_US per step;
    - `shares`: the (critical, warning) shares of the step for its severity;
    - `explains`: rules whose cost this rule's findings already explain (subtracted there: on the same rank for a
      per-rank rule, from the merged findings for a cross-rank rule);
    - `limit`: its findings describe a limit of the hardware (the transfer itself outruns the compute), not a
      cause to remove: ranked after the causes;
    - `distinct_by`: evidence fields that tell two findings of this rule apart (one per call site, per
      collective); findings of the same rule on several ranks merge when these fields agree;
    - `owns`: for a sync rule, the origin of the host syncs it reports (facts/hostsyncs.py `ORIGINS`);
    - `blame`: how the host or GPU events its findings blame on one rank are found (for the timelines); None only
      for a cross-rank rule, whose findings name ranks, not events;
    - `paces`: a cross-rank finding of this rule names the rank that sets the job's pace (its first rank): a
      per-rank cause costs the job what it costs there;
    - `min_share`: a residual (or peer-wait) rule's findings are reported only from this share of the step;
    - `from_inherent`: a cross-rank rule whose findings explain time each rank had counted inherent, not
      unexplained: their `covers` are not taken from the ranks' unexplained exposure;
    - `leftover`: a residual rule whose findings report the exposure no rule explains (they explain nothing): the
      residual rules before it take their part first, and what the cross-rank findings explain on a rank comes
      off its findings only.
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
    owns: Origin | None = None
    blame: Locator | None = None
    paces: bool = False
    min_share: float = 0.0
    from_inherent: bool = False  # a cross-rank rule whose `covers` each rank had counted inherent, not unexplained
    leftover: bool = False  # a residual rule that reports what no rule explains
    needs: str = GPU_FACTS  # what of a trace it reads (GPU_FACTS: not on the
    # CPU lanes of a gloo run)

    def key(self, finding: Finding) -> str:
        """A finding's identity: its rule and the evidence fields that tell its findings apart (the fields
        merge_findings merges by), so a rank's finding and the merged one share it."""
        return self.id + "|" + "|".join(repr(finding.evidence.get(name)) for name in self.distinct_by)

    def merge_key(self, finding: Finding) -> tuple[str, tuple[str, ...]]:
        """What findings of this rule on several ranks must share to merge into one."""
        return self.id, tuple(repr(finding.evidence.get(field)) for field in self.distinct_by)
