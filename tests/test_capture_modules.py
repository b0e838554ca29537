"""A real ZeRO-3 job through `overlapcheck run --with-modules`: its all-gathers and reduce-scatters are attributed to
the modules of its model (an embedding, a GRU, a sequential MLP, a linear head).

One job (2 ranks, gloo on CPU, torchrun; about a minute on 2 cores): the capture annotates DeepSpeed's fetch and
gradient hooks with their module (capture/modules.py) and records module frames; the analysis reads them
(analysis/modules.py).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from builders import torch_extensions_dir

# found, not imported: the jobs import them; importing deepspeed here would cost every xdist worker seconds at
# collection, and only the one that runs the launcher group needs them
if importlib.util.find_spec("torch") is None or importlib.util.find_spec("deepspeed") is None:
    pytest.skip("needs torch and deepspeed (the capture extra)", allow_module_level=True)

pytestmark = pytest.mark.launcher

TRAIN = str(Path(__file__).parent / "jobs" / "train_modules.py")
JOB_TIMEOUT = 420  # seconds


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("modules")
    out = tmp / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OVERLAPCHECK_")}
    env.update(
        DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", TORCH_EXTENSIONS_DIR=torch_extensions_dir()
    )
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    command = ["torchrun", "--nproc_per_node", "2", "--master_port", str(_free_port()), TRAIN, "--steps", "6"]
    argv = [sys.executable, "-m", "overlapcheck", "run", "--out", str(out), "--with-modules"]
    argv += ["--wait", "2", "--warmup", "1", "--active", "2", "--", *command]
    log = tmp / "run.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait(timeout=JOB_TIMEOUT)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert code == 0, log.read_text(errors="replace")[-3000:]
    return out


def test_gathers_and_reduce_scatters_are_attributed_to_the_models_modules(run_folder):
    from overlapcheck.pipeline import analyze

    run = json.loads((run_folder / "run.json").read_text())
    assert run["profiler"]["with_modules"] is True and run["profiler"]["with_stack"] is True
    trace = json.loads(gzip.decompress((run_folder / "traces" / "rank0.pt.trace.json.gz").read_bytes()))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert "nn.Module: GRU_0" in names  # module frames recorded
    assert any(str(n).startswith("overlapcheck.grad: rnn (GRU)") for n in names)  # the hooks annotated

    report = analyze(run_folder, diagnose=False, jobs=1)
    m = report.modules
    assert m is not None and m.ranks == 2 and m.rank_steps == 4 and m.notes == []
    gathers = {r.module: r for r in m.rows if r.kind == "all_gather"}
    buckets = {r.module: r for r in m.rows if r.kind == "reduce_scatter"}
    # every all-gather and reduce-scatter serves a module: fetched at its pre-forward hook, or in its bucket
    assert None not in gathers and None not in buckets
    assert gathers["embed"].cls == "Embedding" and gathers["embed"].source == "annotation"
    assert gathers["embed"].phase == "forward"
    assert {"embed", "rnn", "mlp.0", "mlp.2", "head"} <= set(buckets)
    assert buckets["rnn"].cls == "GRU" and buckets["mlp.0"].cls == "Linear" and buckets["embed"].cls == "Embedding"
    assert all(r.source == "gradient hooks" for r in buckets.values())
    # each collective's time once: per kind the rows add up to the ranks' collective time (one gloo lane each)
    for kind in ("all_gather", "reduce_scatter"):
        rows = sum(r.time_us for r in m.rows if r.kind == kind)
        ranks = sum(r.collectives[kind].time_us for r in report.ranks)
        assert rows == pytest.approx(ranks, rel=1e-6)
    # the summaries (what `overlapcheck report` reads) give the same MODULES object as the traces
    assert analyze(run_folder, diagnose=False, jobs=1, ranks=[0, 1]).modules == m
    traces = analyze(run_folder / "traces", diagnose=False, jobs=1).modules
    assert traces == m
