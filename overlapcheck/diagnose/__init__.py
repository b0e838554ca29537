"""Diagnosis: turn the measured trace into findings (what blocks the overlap, its cost, the fix)."""

from __future__ import annotations

from typing import Any

from overlapcheck.trace.model import TraceModel


def rank_findings(model: TraceModel, rank: dict[str, Any], config: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Findings on one rank's trace (runs in the worker that holds the model)."""
    return []


def merge_findings(report: dict[str, Any], config: dict[str, Any] | None) -> tuple[list[dict[str, Any]], float | None]:
    """Merge per-rank findings across ranks, add cross-rank findings, rank them by cost.

    Returns the findings and the share of exposed communication they explain.
    """
    return [], None
