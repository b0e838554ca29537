"""Analysis: interval algebra, per-rank and per-step overlap metrics, cross-rank statistics."""

from overlapcheck.analysis.pipeline import Options, analyze_paths, analyze_trace

__all__ = ["Options", "analyze_paths", "analyze_trace"]
