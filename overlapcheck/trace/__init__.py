"""Reading traces: streaming JSON, classification of GPU activity, the per-rank TraceModel."""

from overlapcheck.trace.model import TraceModel
from overlapcheck.trace.reader import load_trace, rank_of

__all__ = ["TraceModel", "load_trace", "rank_of"]
