"""overlapcheck bootstrap, put first on PYTHONPATH by `overlapcheck run`.

Python imports `sitecustomize` at start-up, so every Python process of the job (launcher agents, ranks,
their helpers) runs this file. It arms `overlapcheck.capture.hook` (cheap: post-import hooks only),
then runs the `sitecustomize` this one shadows, if any. It never raises.
"""

import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _arm() -> None:
    if not os.environ.get("OVERLAPCHECK_OUT") or os.environ.get("OVERLAPCHECK_DISABLE") == "1":
        return
    if importlib.util.find_spec("overlapcheck") is None:
        sys.path.append(os.path.dirname(os.path.dirname(os.path.dirname(_HERE))))  # source checkout
    from overlapcheck.capture import hook

    hook.install_from_env()


def _chain() -> None:
    paths = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None or spec.origin == os.path.abspath(__file__):
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


for _step in (_arm, _chain):
    try:
        _step()
    except Exception as _exc:  # noqa: BLE001
        print(f"overlapcheck: bootstrap: {_step.__name__}: {_exc!r}", file=sys.stderr)
