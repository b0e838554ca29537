"""Where each finding happens: the host and GPU events a finding blames (its host syncs, the compute-stream waits
it reports, the late launches its syncs caused, the exposed communication it charges), for the timelines. Each
rule says how its events are found (`Rule.blame`); a locator shared by several rules runs once over all their
findings. Computed only when timelines are asked for, from the same facts the rules read."""

from __future__ import annotations

from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.locators import Located, Locator
from overlapcheck.diagnose.registry import BY_ID
from overlapcheck.model import Blame, Finding

MAX_BLAMES = 5_000  # blamed events kept per rank, the costliest first


def finding_key(f: Finding) -> str:
    """A finding's identity: its rule and the evidence fields that tell its findings apart (the same fields
    merge_findings merges by), so a rank's finding and the merged one share it."""
    return BY_ID[f.rule].key(f)


def blamed_events(view: RankFacts, findings: list[Finding]) -> list[Blame]:
    """The host events each of `findings` (one rank's, with their `covers`) blames, costliest first, at most
    MAX_BLAMES."""
    by_locator: dict[Locator, Located] = {}
    for f in findings:
        rule = BY_ID[f.rule]
        if rule.blame is not None:
            by_locator.setdefault(rule.blame, []).append((rule, f))
    out: list[Blame] = []
    for locate, located in by_locator.items():
        out += locate(view, located)
    out.sort(key=lambda b: (-b.cost_us, b.start))
    return sorted(out[:MAX_BLAMES], key=lambda b: b.start)
