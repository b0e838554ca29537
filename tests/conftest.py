"""Shared fixtures: tiny hand-built Kineto traces and the real traces in ../shared/traces."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest

SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"


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


@pytest.fixture
def shared_traces() -> Path:
    if not SHARED_TRACES.is_dir():
        pytest.skip("../shared/traces is not present")
    return SHARED_TRACES


@pytest.fixture(autouse=True)
def _no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", os.environ.get("COLUMNS", "120"))
