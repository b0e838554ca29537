"""Where the per-rank work runs: in this process, in a local process pool, or on a Dask cluster.

The pipeline hands an executor the trace files and the function that analyzes one of them (`pipeline._worker`:
path -> Outcome, errors the user can cause returned as one line, never raised); the executor returns one Outcome
per file, in input order, and calls `advance(n)` with the bytes consumed as it goes (docs/scale.md).

- `LocalExecutor`: one file at a time in this process (a single file gets every core), or a process pool.
- `DaskExecutor`: one dask.distributed task per file. Workers get paths, not bytes (they read the shared file
  system); only the small per-rank results travel back, and the merge runs here. A worker lost mid-task is
  retried on another (the scheduler's `allowed-failures`); a file whose tasks keep killing workers is reported as
  unreadable. Dask is optional (`pip install 'overlapcheck[dask]'`) and imported only here, only when used.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TYPE_CHECKING, Any, Protocol

from overlapcheck.compact import Compactor
from overlapcheck.errors import UserError

if TYPE_CHECKING:
    from overlapcheck.job import JobContext
    from overlapcheck.model import RankResult
    from overlapcheck.pipeline import Options

Outcome = tuple[str, list["RankResult"], "str | None"]  # (source, its ranks, error or None)
# (path, job, options, progress, processes decoding the file) -> Outcome
Worker = Callable[..., Outcome]


class Executor(Protocol):
    def run(
        self,
        worker: Worker,
        paths: Sequence[str],
        job: JobContext,
        options: Options,
        sizes: dict[str, int],
        advance: Callable[[int], None],
    ) -> list[Outcome]: ...


class LocalExecutor:
    """`jobs` processes on this machine (default: every core); one process: the work runs in this one."""

    def __init__(self, jobs: int | None = None):
        self.jobs = jobs

    def run(
        self,
        worker: Worker,
        paths: Sequence[str],
        job: JobContext,
        options: Options,
        sizes: dict[str, int],
        advance: Callable[[int], None],
    ) -> list[Outcome]:
        cores = self.jobs or os.cpu_count() or 1
        n_jobs = max(1, min(cores, len(paths)))
        outcomes: list[Outcome | None] = [None] * len(paths)
        keep = _keeper()
        if n_jobs == 1:
            for i, path in enumerate(paths):
                seen = [0]

                def progress(n: int, seen: list[int] = seen) -> None:
                    advance(n - seen[0])
                    seen[0] = n

                # a single file gets every core (fewer files than cores: see the pool below)
                outcomes[i] = keep(worker(path, job, options, progress, cores if len(paths) == 1 else 1))
                advance(sizes.get(path, 0) - seen[0])
        else:
            with ProcessPoolExecutor(max_workers=n_jobs) as pool:
                per_file = max(1, cores // len(paths))  # 2 files on 8 cores: 4 processes decode each
                futures = {pool.submit(worker, path, job, options, None, per_file): i for i, path in enumerate(paths)}
                for fut in as_completed(futures):
                    outcomes[futures[fut]] = keep(fut.result())
                    advance(sizes.get(paths[futures[fut]], 0))
        return [o for o in outcomes if o is not None]


CONNECT_TIMEOUT_S = 10.0


class DaskExecutor:
    """The per-rank work as tasks on the dask.distributed cluster whose scheduler is at `address`
    (`tcp://host:8786`, or a scheduler file's path). At most `window` tasks are in flight at a time (default: 4
    per worker thread, at least 64), so that a 50,000-rank folder does not hold 50,000 futures here."""

    def __init__(self, address: str, window: int | None = None, timeout: float | None = None):
        self.address = address
        self.window = window
        self.timeout = timeout

    def connect(self) -> Any:
        """A `distributed.Client`, or a one-line UserError when Dask is missing or the scheduler unreachable."""
        try:
            from distributed import Client
        except ImportError:
            raise UserError("--scheduler needs Dask: pip install 'overlapcheck[dask]'") from None
        address = scheduler_address(self.address)
        try:
            return Client(address=address, timeout=self.timeout or CONNECT_TIMEOUT_S, set_as_default=False)
        except Exception as exc:  # distributed raises AssertionError, KeyError, ... for a file that is no scheduler's
            why = " ".join(str(exc).split()) or type(exc).__name__
            raise UserError(f"cannot reach the Dask scheduler at {self.address}: {why}") from None

    def run(
        self,
        worker: Worker,
        paths: Sequence[str],
        job: JobContext,
        options: Options,
        sizes: dict[str, int],
        advance: Callable[[int], None],
    ) -> list[Outcome]:
        from distributed import as_completed
        from distributed.scheduler import KilledWorker

        outcomes: list[Outcome | None] = [None] * len(paths)
        if not paths:
            return []
        keep = _keeper()
        client = self.connect()
        try:
            threads = sum(client.nthreads().values()) or 1
            window = self.window or max(64, 4 * threads)
            shared = client.scatter([job, options], broadcast=True, hash=False)
            cwd = os.getcwd()
            run_id = uuid.uuid4().hex[:8]
            index: dict[str, int] = {}

            def submit(i: int) -> Any:
                # a key that names the file, so the dashboard (and the tests) can tell the tasks apart
                key = f"overlapcheck-{run_id}-{i}-{os.path.basename(paths[i])}"
                index[key] = i
                return client.submit(remote, worker, paths[i], cwd, *shared, key=key, pure=False, retries=0)

            queue = iter(range(len(paths)))
            first = [submit(i) for _, i in zip(range(window), queue, strict=False)]
            pending = as_completed(first, loop=client.loop)
            for fut in pending:
                i = index.pop(fut.key)
                try:
                    outcomes[i] = keep(fut.result())
                except KilledWorker as exc:
                    lost = f"{paths[i]}: the Dask workers analyzing this file were lost (out of memory?): {exc}"
                    outcomes[i] = (paths[i], [], " ".join(lost.split()))
                fut.release()
                advance(sizes.get(paths[i], 0))
                nxt = next(queue, None)
                if nxt is not None:
                    pending.add(submit(nxt))
        finally:
            client.close()
        return [o for o in outcomes if o is not None]


def _keeper() -> Callable[[Outcome], Outcome]:
    """How an outcome is held once it arrives: its ranks' empty Splits and Copies shared (overlapcheck/compact.py)."""
    compactor = Compactor()

    def keep(outcome: Outcome) -> Outcome:
        source, results, error = outcome
        return source, [compactor.result(r) for r in results], error

    return keep


def remote(worker: Worker, path: str, cwd: str, job: JobContext, options: Options) -> Outcome:
    """One file on a Dask worker: a relative path is read from the client's working directory (the worker's
    own may differ) and named as given, so the report and its errors are those of a local run."""
    if os.path.isabs(path):
        return worker(path, job, options)
    real = os.path.join(cwd, path)
    source, results, error = worker(real, job, options)
    if error is not None:
        error = error.replace(real, path)
    return path, [_renamed(r, real, path) for r in results], error


def _renamed(result: RankResult, real: str, path: str) -> RankResult:
    import dataclasses

    if result.metrics.source != real:
        return result
    return dataclasses.replace(result, metrics=dataclasses.replace(result.metrics, source=path))


def executor(scheduler: str | None = None, jobs: int | None = None) -> Executor:
    """The Dask cluster at `scheduler` (`--scheduler`), else the local process pool of `jobs` processes."""
    return DaskExecutor(scheduler) if scheduler is not None else LocalExecutor(jobs)


# what a Dask scheduler listens on: [tcp|tls|ws|wss|ucx://]host:port (an inproc:// one is no other process's)
_ADDRESS = re.compile(r"(?:(?:tcp|tls|ws|wss|ucx)://)?(?:[\w.\-]+|\[[0-9a-fA-F:]+\]):\d{1,5}")


def scheduler_address(given: str) -> str:
    """The scheduler's address: `given` itself (tcp://host:8786, host:8786), or the `address` of the scheduler
    file at `given` (what `dask scheduler --scheduler-file` writes); a one-line UserError for anything else, before
    a Client is built (a half-built one reports its failure again at exit)."""
    if os.path.isfile(given):
        try:
            with open(given, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, UnicodeDecodeError, ValueError):
            doc = None
        address = doc.get("address") if isinstance(doc, dict) else None
        if not isinstance(address, str) or not _ADDRESS.fullmatch(address):
            raise UserError(f"--scheduler {given}: not a Dask scheduler file (JSON with the scheduler's address)")
        return address
    if _ADDRESS.fullmatch(given):
        return given
    raise UserError(
        f"--scheduler {given!r}: neither a scheduler address (tcp://host:8786) nor an existing scheduler file"
    )
