"""Helpers shared by the tests (test modules never import each other; conftest.py holds only fixtures).

- where the real traces are: `shared_traces_dir()`;
- tiny hand-built Kineto traces: `kernel`, `launch`, `step`, `memcpy`, `write_trace`;
- hand-built report documents (docs/report-schema.md) and timelines for the renderers and the gate:
  `report_doc` (the JSON document, a dict, to change or to write to a file), `make_report` (the same as a typed
  `Report`), `as_report` (a document, changed, as a `Report`), the parts `make_rank` and `make_finding`
  (document dicts) and `make_timeline` (a typed `Timeline`); `XSS_*` payloads for the escaping tests;
- `run_cli` (the CLI in a subprocess) and `Page` (an HTML page, parsed);
- `torch_extensions_dir()`: where the real DeepSpeed jobs keep the shm comm op they JIT-build;
- `SimulatedSets`: simulated trace sets, each written once per test session and shared by every test (and every
  xdist worker) that asks for the same scenario and options (conftest.py's `simulated` fixture).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from overlapcheck.model import Report, Timeline, TimelineLane

ROOT = Path(__file__).resolve().parents[1]  # the checkout


# -------------------------------------------------------------------------------------------- real traces


def shared_traces_dir() -> Path | None:
    """The real Kineto traces (../shared/traces beside the checkout), or None when they are not there."""
    path = ROOT.parent / "shared" / "traces"
    return path if path.is_dir() else None


# -------------------------------------------------------------------------------------------- real jobs


def torch_extensions_dir() -> str:
    """TORCH_EXTENSIONS_DIR for the real DeepSpeed jobs: the caller's own, or one folder per Python environment.

    Every DeepSpeed rank on CPU loads the shm comm op, which torch JIT-builds (a minute or more on 2 cores) into
    ~/.cache/torch_extensions/py311_cpu/deepspeed_shm_comm by default and rebuilds whenever the build's flags
    differ from the last build's there; the flags name the environment's site-packages, so two environments on one
    machine (a CI venv beside a developer's) rebuild it for each other, once per launch in the worst case. Keyed by
    the environment, the op is built once per environment and kept."""
    given = os.environ.get("TORCH_EXTENSIONS_DIR")
    if given:
        return given
    key = hashlib.sha256(f"{sys.prefix}|{sys.version}".encode()).hexdigest()[:12]
    return str(Path.home() / ".cache" / "torch_extensions" / f"overlapcheck-tests-{key}")


# -------------------------------------------------------------------------------------------- simulated sets


class SimulatedSets:
    """Simulated trace sets under `root`, each generated once: `get(scenario, **options)` returns the folder that
    `overlapcheck.simulate.generate(scenario, folder, **options)` wrote, and its truth document. A 4x8 set takes
    tens of seconds to simulate (with its counterfactuals), and several test files (and both xdist workers)
    ask for the same ones; `root` is shared by the workers of one session, a lock per set makes the first worker
    that asks write it and the others wait for it. The folders are read-only for the tests."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def get(self, scenario: str, **options: Any) -> tuple[Path, dict[str, Any]]:
        key = json.dumps([scenario, options], sort_keys=True)
        name = f"{scenario}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"
        folder = self.root / name
        with _locked(self.root / f"{name}.lock"):
            if not folder.is_dir():  # written beside it, then renamed: a folder that is there is complete
                from overlapcheck.simulate import generate

                partial = self.root / f"{name}.{os.getpid()}.partial"
                shutil.rmtree(partial, ignore_errors=True)
                generate(scenario, partial, **options)
                partial.rename(folder)
        return folder, json.loads((folder / "truth.json").read_text())

    def folder(self, scenario: str, **options: Any) -> Path:
        return self.get(scenario, **options)[0]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` across processes (POSIX; elsewhere none, and two workers may both simulate a
    set: the second rename fails and its copy is dropped)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# -------------------------------------------------------------------------------------------- tiny traces


def kernel(name: str, ts: float, dur: float, stream: int = 7, corr: int = -1, **args: Any) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"device": 0, "stream": stream, "correlation": corr, **args},
    }


def memcpy(ts: float, dur: float, stream: int = 7, corr: int = -1) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "gpu_memcpy",
        "name": "Memcpy DtoD (Device -> Device)",
        "pid": 0,
        "tid": stream,
        "ts": ts,
        "dur": dur,
        "args": {"device": 0, "stream": stream, "correlation": corr},
    }


def launch(ts: float, corr: int, dur: float = 1.0, tid: int = 100) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 100,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr},
    }


def runtime(name: str, ts: float, dur: float, corr: int, tid: int = 100) -> dict[str, Any]:
    """A CUDA runtime call (cudaStreamSynchronize, cudaMemcpyAsync, cudaStreamWaitEvent, ...)."""
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": name,
        "pid": 100,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": {"correlation": corr},
    }


def frame(name: str, ts: float, dur: float, tid: int = 100) -> dict[str, Any]:
    """A python_function frame (with_stack=True), e.g. `train.py(57): grad_hook`."""
    return {"ph": "X", "cat": "python_function", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur}


def cpu_op(name: str, ts: float, dur: float, tid: int = 100) -> dict[str, Any]:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur}


def step(number: int, ts: float, dur: float, tid: int = 100) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "user_annotation",
        "name": f"ProfilerStep#{number}",
        "pid": 100,
        "tid": tid,
        "ts": ts,
        "dur": dur,
    }


def write_trace(
    folder: Path,
    name: str,
    events: list[dict[str, Any]],
    rank: int | None = 0,
    world_size: int = 2,
    gz: bool = True,
    **top: Any,
) -> Path:
    """Write a trace in the wrapped form (with distributedInfo when rank is not None)."""
    doc: dict[str, Any] = {"schemaVersion": 1, **top}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": rank, "world_size": world_size}
    doc["traceEvents"] = events
    path = folder / name
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def diagnose_events(folder: Path, events: list[dict[str, Any]], config: dict[str, Any] | None = None) -> Report:
    """Write `events` as rank 0 of a 2-rank job in `folder` and analyze it (one process), with `config` as the
    ds_config."""
    from overlapcheck.pipeline import analyze

    folder.mkdir(parents=True, exist_ok=True)
    write_trace(folder, "rank0.trace.json.gz", events, rank=0, world_size=2)
    return analyze(folder, ds_config=config, jobs=1)


def findings_by_rule(report: Report) -> dict[str, Any]:
    """The report's findings by rule id (the first of each)."""
    return {f.rule: f for f in report.findings}


# ------------------------------------------------------------------------------------------------ the CLI


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m overlapcheck ARGS...` in a subprocess (text output captured)."""
    return subprocess.run(
        [sys.executable, "-m", "overlapcheck", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


# ------------------------------------------------------------------------------------------- HTML pages


class Page(HTMLParser):
    """Collects elements, attributes, script blocks and visible text of a page."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[tuple[dict, str]] = []
        self.text: list[str] = []
        self._script: dict | None = None
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        if tag == "script":
            self._script = dict(attrs)
            self.scripts.append((self._script, ""))

    def handle_endtag(self, tag):
        if tag == "script":
            self._script = None

    def handle_data(self, data):
        if self._script is not None:
            attrs, body = self.scripts[-1]
            self.scripts[-1] = (attrs, body + data)
        else:
            self.text.append(data)

    def visible(self) -> str:
        return " ".join(" ".join(self.text).split())

    def json_blocks(self) -> list[dict]:
        return [json.loads(body) for attrs, body in self.scripts if attrs.get("type") == "application/json"]


# ------------------------------------------------------------------------------------------------ reports

# written out here (not imported from the package) so that the fixtures check the schema independently
KINDS = ("all", "reduce_scatter", "all_gather", "all_reduce", "all_to_all", "send_recv", "broadcast", "other")
XSS_SCRIPT = "</script><script>alert(1)</script>"
XSS_IMG = "<img src=x onerror=alert(1)>"


def split(time_us: float = 0.0, overlap: float | None = None, count: int | None = None) -> dict:
    """One SPLIT; `overlap` is the hidden fraction of `time_us`."""
    if not time_us:
        return {"count": count or 0, "time_us": 0.0, "overlapped_us": 0.0, "exposed_us": 0.0, "overlap": None}
    hidden = time_us * (overlap or 0.0)
    return {
        "count": count if count is not None else max(1, int(time_us // 500)),
        "time_us": time_us,
        "overlapped_us": hidden,
        "exposed_us": time_us - hidden,
        "overlap": hidden / time_us,
    }


def collectives(
    rs: tuple[float, float] = (0, 0), ag: tuple[float, float] = (0, 0), ar: tuple[float, float] = (0, 0)
) -> dict:
    """COLLECTIVES from (time_us, overlap) for reduce-scatter, all-gather and all-reduce."""
    out = {k: split() for k in KINDS}
    out["reduce_scatter"], out["all_gather"], out["all_reduce"] = split(*rs), split(*ag), split(*ar)
    parts = [out["reduce_scatter"], out["all_gather"], out["all_reduce"]]
    time = sum(p["time_us"] for p in parts)
    hidden = sum(p["overlapped_us"] for p in parts)
    out["all"] = {
        "count": sum(p["count"] for p in parts),
        "time_us": time,
        "overlapped_us": hidden,
        "exposed_us": time - hidden,
        "overlap": hidden / time if time else None,
    }
    return out


def make_rank(
    rank: int,
    overlap: float = 0.7,
    compute_us: float = 80_000.0,
    steps: int = 2,
    comm_us: float = 30_000.0,
    source: str | None = None,
    host: str | None = None,
) -> dict:
    """One RANK document with `steps` equal steps; reduce-scatter is less hidden than all-gather."""
    rs_o, ag_o = max(overlap - 0.15, 0.0), min(overlap + 0.1, 1.0)
    coll = collectives(rs=(comm_us * 0.4, rs_o), ag=(comm_us * 0.6, ag_o))
    exposed = coll["all"]["exposed_us"]
    step_time = compute_us + exposed + 2_000.0
    step_list = []
    for i in range(steps):
        sc = collectives(rs=(comm_us * 0.4 / steps, rs_o), ag=(comm_us * 0.6 / steps, ag_o))
        step_list.append(
            {
                "step": 10 + i,
                "start_us": 1e6 + i * step_time / steps,
                "duration_us": step_time / steps,
                "cpu_duration_us": step_time / steps * 0.9,
                "compute_us": compute_us / steps,
                "exposed_share": sc["all"]["exposed_us"] / (step_time / steps),
                "collectives": sc,
                "memcpy": {"count": 2, "time_us": 40.0, "exposed_us": 10.0},
                "memset": {"count": 1, "time_us": 5.0, "exposed_us": 0.0},
                "phases": {},
                "period_start_us": 1e6 + i * step_time / steps,  # the steps' periods tile the rank's timeline
                "period_us": step_time / steps,
            }
        )
    return {
        "rank": rank,
        "source": source or f"traces/rank{rank}.trace.json.gz",
        "world_size": None,
        "backend": "nccl",
        "host": host or f"node-{rank // 8}",
        "lanes": "gpu",
        "span_us": step_time,
        "busy_us": step_time - 2_000.0,
        "compute_us": compute_us,
        "idle_us": 2_000.0,
        "step_time_us": step_time,
        "exposed_share": exposed / step_time,
        "collectives": coll,
        "memcpy": {"count": 4, "time_us": 80.0, "exposed_us": 20.0},
        "memset": {"count": 2, "time_us": 10.0, "exposed_us": 0.0},
        "streams": [
            {
                "stream": 7,
                "kernels": 400,
                "busy_us": compute_us,
                "classes": {"compute": 400, "comm": 0, "memcpy": 4, "memset": 2},
            },
            {
                "stream": 24,
                "kernels": 60,
                "busy_us": comm_us,
                "classes": {"compute": 0, "comm": 60, "memcpy": 0, "memset": 0},
            },
        ],
        "steps": step_list,
        "notes": [],
        "before_first_step": outside(),
        "outside_steps": outside(),
        "bandwidth": {},
        "kind_from": {"launching op": 60},
    }


def outside(count: int = 0, comm_us: float = 0.0, overlap: float | None = None) -> dict:
    """One OUTSIDE object (activities in no step): `count` activities, reduce-scatter of `comm_us`."""
    coll = collectives(rs=(comm_us, overlap or 0.0))
    return {
        "count": count,
        "busy_us": comm_us,
        "compute_us": 0.0,
        "collectives": coll,
        "memcpy": {"count": 0, "time_us": 0.0, "exposed_us": 0.0},
        "memset": {"count": 0, "time_us": 0.0, "exposed_us": 0.0},
    }


def summary_doc(ranks: list[dict]) -> dict:
    """SUMMARY over rank documents (min/median/max and worst_rank), as docs/metrics.md defines it."""

    def stat(values: list[tuple[int, float]], worst_high: bool) -> dict:
        vals = [v for _, v in values]
        worst = (max if worst_high else min)(values, key=lambda p: p[1])[0]
        return {"min": min(vals), "median": statistics.median(vals), "max": max(vals), "worst_rank": worst}

    metrics = {}
    for kind in KINDS:
        ov = [
            (r["rank"], r["collectives"][kind]["overlap"])
            for r in ranks
            if r["collectives"][kind]["overlap"] is not None
        ]
        if ov:
            metrics[f"{kind}.overlap"] = stat(ov, False)
            metrics[f"{kind}.exposed_us"] = stat(
                [(r["rank"], r["collectives"][kind]["exposed_us"]) for r in ranks], True
            )
    for key in ("exposed_share", "idle_us", "compute_us", "span_us"):
        vals = [(r["rank"], r[key]) for r in ranks if r[key] is not None]
        if vals:
            metrics[key] = stat(vals, key != "compute_us")
    return {"ranks": len(ranks), "metrics": metrics}


def make_finding(rule: str = "reduce-scatter-deferred", cost_us: float = 4_200.0, **kw: Any) -> dict:
    """One FINDING document; keyword arguments replace its fields."""
    finding = {
        "rule": rule,
        "severity": "critical",
        "title": "Reduce-scatter runs after the last backward kernel",
        "why": "reduce_bucket_size (500M) is larger than the model's gradients: one flush at the end of backward",
        "cost_us": cost_us,
        "ranks": [0, 1, 2, 3],
        "steps": [10, 11],
        "evidence": {
            "last_backward_kernel_end_us": 1234.5,
            "first_reduce_scatter_us": 1300.0,
            "call_site": "deepspeed/runtime/zero/stage3.py:1234 reduce_independent_p_g_buckets",
            "buckets": [{"size": 500000000, "exposed_us": 4200.0}],
        },
        "fix": {
            "config": {"zero_optimization.reduce_bucket_size": 50000000, "zero_optimization.overlap_comm": True},
            "env": {"CUDA_DEVICE_MAX_CONNECTIONS": None, "NCCL_ALGO": "Ring"},
            "upgrade": "deepspeed>=0.14.3",
        },
    }
    finding.update(kw)
    return finding


def report_doc(
    n_ranks: int = 4,
    overlaps: list[float] | None = None,
    findings: list[dict] | None = None,
    errors: list[dict] | None = None,
    compute: list[float] | None = None,
) -> dict:
    """A whole `overlapcheck.report/1` document (a dict, as `Report.to_dict()` gives it)."""
    overlaps = overlaps or [0.7 - 0.05 * (i % 3) for i in range(n_ranks)]
    compute = compute or [80_000.0] * n_ranks
    ranks = [make_rank(i, overlap=overlaps[i], compute_us=compute[i]) for i in range(n_ranks)]
    return {
        "schema": "overlapcheck.report/1",
        "tool": {"name": "overlapcheck", "version": "0.1.0"},
        "run": None,
        "ranks": ranks,
        "summary": summary_doc(ranks),
        "findings": [make_finding()] if findings is None else findings,
        "findings_explain_share": 0.8,
        "errors": errors or [],
    }


def as_report(doc: dict, timelines: dict[int, Timeline] | None = None) -> Report:
    """A report document as the typed Report (validated by `Report.from_dict`), with in-memory timelines."""
    report = Report.from_dict(doc)
    return dataclasses.replace(report, timelines=timelines) if timelines else report


def make_report(
    n_ranks: int = 4,
    overlaps: list[float] | None = None,
    findings: list[dict] | None = None,
    errors: list[dict] | None = None,
    compute: list[float] | None = None,
    timelines: dict[int, Timeline] | None = None,
) -> Report:
    """`report_doc(...)` as a typed Report, with `timelines` (rank -> Timeline) for the HTML page."""
    return as_report(report_doc(n_ranks, overlaps, findings, errors, compute), timelines)


def make_timeline(
    step: int = 10,
    n_compute: int = 300,
    n_comm: int = 40,
    seed: int = 0,
    kernel_name: str | None = None,
    compute_label: str = "stream 7",
) -> Timeline:
    """A timeline (what the HTML renderer draws) of one step on three lanes; the compute lane's event 5 is named
    `kernel_name` when given; the step ends with an exposed reduce-scatter."""
    rng = random.Random(seed)
    names = [
        "ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_64x3_tn",
        "vectorized_elementwise_kernel",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "Memcpy DtoD (Device -> Device)",
    ]
    if kernel_name is not None:
        names.append(kernel_name)
    events: list[list[Any]] = []
    t = 0.0
    for i in range(n_compute):
        dur = rng.uniform(20, 400)
        name = len(names) - 1 if kernel_name is not None and i == 5 else rng.choice([0, 1])
        events.append([0, t, dur, "compute", name])
        t += dur + rng.uniform(0, 30)
    end = t
    comm_t, exposed = 0.0, []
    for i in range(n_comm):
        dur = rng.uniform(100, 900)
        rs = i >= n_comm // 2
        events.append([1, comm_t, dur, "comm:reduce_scatter" if rs else "comm:all_gather", 2 if rs else 3])
        comm_t += dur + rng.uniform(50, 500)
    events.append([1, end + 10.0, 1500.0, "comm:reduce_scatter", 2])
    exposed.append([end + 10.0, end + 1510.0])
    for i in range(6):
        events.append([2, i * end / 6, 30.0, "memcpy", 4])
    return Timeline(
        step=step,
        t0=1.7e12,
        duration=end + 1510.0,
        lanes=[
            TimelineLane(0, compute_label, "compute"),
            TimelineLane(1, "stream 24", "comm"),
            TimelineLane(2, "stream 9", "memcpy"),
        ],
        events=events,
        names=names,
        exposed=exposed,
    )
