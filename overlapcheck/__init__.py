"""overlapcheck: measure how much of a DeepSpeed ZeRO-3 job's communication hides behind compute."""

__version__ = "0.1.0"
