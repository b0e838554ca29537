"""`overlapcheck run`: profile an unmodified training job on every rank.

The launcher side (`launchers`, `propagation`, `supervisor`, `manifest`) runs in the `overlapcheck run`
process; the rank side (`bootstrap/sitecustomize.py` -> `hook` -> `profiler` -> `summary`) runs inside each
rank's Python process. The two sides only share the environment variables of `settings` and the files
in the run folder.
"""
