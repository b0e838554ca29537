"""What every cross-rank rule reads: every rank's result and the job context, plus the job-wide facts that
several readers share, each computed once and lazily: the job's bandwidth (analysis/bandwidth.py), which the
`bandwidth-bound` rule judges and the report's BANDWIDTH object shows."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

from overlapcheck.analysis.bandwidth import job_bandwidth
from overlapcheck.job import JobContext
from overlapcheck.model import JobBandwidth, RankResult


class JobFacts:
    """Every rank's result (in rank order) and the job context, with the facts shared across ranks."""

    def __init__(self, results: Sequence[RankResult], job: JobContext | None = None) -> None:
        self.results = results
        self.job = job or JobContext()

    @cached_property
    def bandwidth(self) -> JobBandwidth | None:
        """Per collective kind across ranks, and the hideability per phase (None: no collective of known size)."""
        return job_bandwidth(self.results, self.job)
