"""Analysis: interval algebra, per-rank and per-step overlap metrics, cross-rank statistics (docs/metrics.md)."""
