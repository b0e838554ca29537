"""overlapcheck: measure how much of a DeepSpeed ZeRO-3 job's communication hides behind compute.

    import overlapcheck
    report = overlapcheck.analyze("traces/", ds_config="ds.json")
    report.dataframe("ranks")

docs/api.md describes the Python API; `overlapcheck --help` the command line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

if TYPE_CHECKING:
    from overlapcheck.errors import UserError
    from overlapcheck.model import Finding, RankMetrics, Report
    from overlapcheck.pipeline import analyze

__all__ = ["Finding", "RankMetrics", "Report", "UserError", "__version__", "analyze"]

_LAZY = {
    "analyze": "overlapcheck.pipeline",
    "Report": "overlapcheck.model",
    "RankMetrics": "overlapcheck.model",
    "Finding": "overlapcheck.model",
    "UserError": "overlapcheck.errors",
}


def __dir__() -> list[str]:
    """The lazy names too, so that `dir(overlapcheck)` and tab completion show `analyze`."""
    return sorted({*globals(), *_LAZY})


def __getattr__(name: str) -> Any:
    """The API is imported on first use, so that `import overlapcheck` (and the CLI's start-up) stays light."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'overlapcheck' has no attribute {name!r}")
