"""Per-module attribution (analysis/modules.py) on tiny hand-built traces: each source, the bucket windows, the
even split of shared collectives, the honest "no module information", and the MODULES object's round trip."""

from __future__ import annotations

import json

import numpy as np
import pytest
from builders import frame, kernel, launch, shared_traces_dir, step, write_trace

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.modules import (
    GRAD_ANNOTATION,
    MODULE_ANNOTATION,
    NO_BACKWARD_INFO,
    NO_MODULE_INFO,
    PARAMS_ANNOTATION,
    merge_modules,
    overlapped_each,
)
from overlapcheck.model import Report
from overlapcheck.pipeline import analyze

AG = "ncclDevKernel_AllGather_RING_LL"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"
GEMM = "sm90_xmma_gemm_bf16"


def annotation(name: str, ts: float, dur: float, tid: int = 100) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur}


def _rows(report: Report) -> dict:
    assert report.modules is not None
    return {(r.module, r.kind, r.source): r for r in report.modules.rows}


def test_module_frames_name_the_forward_gathers_with_their_hierarchy(tmp_path):
    events = [
        step(1, 0, 1000),
        frame("nn.Module: DeepSpeedEngine_0", 10, 900),
        frame("nn.Module: Net_0", 20, 800),
        frame("nn.Module: Linear_1", 100, 100),
        launch(110, corr=1),  # issued inside Linear_1's pre-forward hook
        frame("nn.Module: GRU_0", 300, 100),
        launch(310, corr=2),
        kernel(AG, 200, 100, stream=20, corr=1),
        kernel(AG, 400, 50, stream=20, corr=2),
        kernel(GEMM, 250, 100, stream=7),  # covers the first gather's last 50 µs
    ]
    report = analyze(write_trace(tmp_path, "rank0.json.gz", events, world_size=1), diagnose=False)
    rows = _rows(report)
    linear = rows[("Net_0.Linear_1", "all_gather", "module frame")]
    assert (linear.count, linear.time_us, linear.hidden_us, linear.exposed_us) == (1, 100.0, 50.0, 50.0)
    assert linear.cls == "Linear"
    gru = rows[("Net_0.GRU_0", "all_gather", "module frame")]
    assert (gru.time_us, gru.exposed_us) == (50.0, 50.0)
    assert report.modules.ranks == 1 and report.modules.rank_steps == 1
    assert report.modules.rows[0].module == "Net_0.Linear_1" or report.modules.rows[0].exposed_us == 50.0


def test_gradient_hooks_fill_buckets_and_a_shared_bucket_is_split_evenly(tmp_path):
    """Hooks that ended since the previous bucket and before this one's issue; the hook issuing a bucket adds its
    own gradient to the next one (it ends after the issue)."""
    events = [
        step(1, 0, 2000),
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "autograd::engine::evaluate_function: X",
            "pid": 100,
            "tid": 100,
            "ts": 100,
            "dur": 1000,
        },
        annotation(GRAD_ANNOTATION + "head (Linear)", 110, 20),
        annotation(GRAD_ANNOTATION + "mlp.2 (Linear)", 140, 20),
        annotation(GRAD_ANNOTATION + "mlp.0 (Linear)", 200, 50),
        launch(210, corr=1),  # bucket 1 issued inside mlp.0's hook: head + mlp.2
        annotation(GRAD_ANNOTATION + "embed (Embedding)", 300, 20),
        launch(1200, corr=2),  # the epilogue's bucket: mlp.0 + embed
        kernel(RS, 220, 100, stream=21, corr=1),
        kernel(RS, 1210, 40, stream=21, corr=2),
    ]
    report = analyze(write_trace(tmp_path, "rank0.json.gz", events, world_size=1), diagnose=False)
    rows = _rows(report)
    for name in ("head", "mlp.2"):
        r = rows[(name, "reduce_scatter", "gradient hooks")]
        assert (r.count, r.time_us, r.exposed_us) == (1, 50.0, 50.0)
        assert r.phase == "backward" and r.cls == "Linear"
    for name in ("mlp.0", "embed"):
        r = rows[(name, "reduce_scatter", "gradient hooks")]
        assert (r.count, r.time_us) == (1, 20.0)
    assert sum(r.time_us for r in report.modules.rows) == pytest.approx(140.0)  # each µs once
    assert report.modules.notes == []


def test_fetch_annotations_win_over_module_frames(tmp_path):
    events = [
        step(1, 0, 1000),
        frame("nn.Module: Net_0", 10, 900),
        annotation(MODULE_ANNOTATION + "layers.3.attn (Attention)", 100, 50),
        launch(110, corr=1),
        kernel(AG, 200, 100, stream=20, corr=1),
    ]
    report = analyze(write_trace(tmp_path, "rank0.json.gz", events, world_size=1), diagnose=False)
    (row,) = report.modules.rows
    assert (row.module, row.cls, row.source, row.kind) == ("layers.3.attn", "Attention", "annotation", "all_gather")


def test_a_gather_is_the_modules_whose_parameters_it_fetches_when_the_capture_names_them(tmp_path):
    """Inside the fetch of `Net` (the root's pre-forward hook), the prefetch of two modules' parameters: the
    gather serves those two, its time split evenly."""
    events = [
        step(1, 0, 1000),
        annotation(MODULE_ANNOTATION + "Net (Net)", 100, 200),
        annotation(PARAMS_ANNOTATION + "rnn (GRU); mlp.0 (Linear)", 120, 50),
        launch(130, corr=1),
        annotation(PARAMS_ANNOTATION + "... 3 more", 180, 10),  # only a count: the hook's module
        launch(182, corr=2),
        kernel(AG, 200, 100, stream=20, corr=1),
        kernel(AG, 300, 10, stream=20, corr=2),
    ]
    report = analyze(write_trace(tmp_path, "rank0.json.gz", events, world_size=1), diagnose=False)
    rows = _rows(report)
    assert rows[("rnn", "all_gather", "annotation")].time_us == 50.0
    assert rows[("mlp.0", "all_gather", "annotation")].cls == "Linear"
    assert rows[("Net", "all_gather", "annotation")].time_us == 10.0


def test_forward_frames_are_the_fallback_and_library_frames_are_skipped(tmp_path):
    events = [
        step(1, 0, 1000),
        frame("train.py(38): forward", 10, 900),
        frame("torch/nn/modules/module.py(1782): _call_impl", 100, 50),
        frame("deepspeed/runtime/zero/linear.py(84): forward", 100, 50),
        launch(110, corr=1),
        kernel(AG, 200, 100, stream=20, corr=1),
    ]
    report = analyze(write_trace(tmp_path, "rank0.json.gz", events, world_size=1), diagnose=False)
    (row,) = report.modules.rows
    assert (row.module, row.source) == ("train.py(38): forward", "forward frame")
    assert report.modules.notes == []  # python frames, nothing in the backward pass: nothing to say


def test_without_python_frames_the_report_says_attribution_needs_them(tmp_path):
    events = [step(1, 0, 1000), launch(110, corr=1), kernel(AG, 200, 100, stream=20, corr=1)]
    report = analyze(write_trace(tmp_path, "rank0.json.gz", events, world_size=1), diagnose=False)
    (row,) = report.modules.rows
    assert row.module is None and row.source == "none" and row.time_us == 100.0
    assert report.modules.notes == [NO_MODULE_INFO]
    assert "--with-modules" in NO_MODULE_INFO


def test_backward_collectives_outside_module_frames_are_said_unattributed(tmp_path):
    events = [
        step(1, 0, 2000),
        frame("nn.Module: Net_0", 10, 90),
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": "autograd::engine::evaluate_function: X",
            "pid": 100,
            "tid": 100,
            "ts": 100,
            "dur": 1000,
        },
        launch(210, corr=1),
        kernel(RS, 220, 100, stream=21, corr=1),
    ]
    report = analyze(write_trace(tmp_path, "rank0.json.gz", events, world_size=1), diagnose=False)
    (row,) = report.modules.rows
    assert row.module is None and row.phase == "backward"
    assert report.modules.notes == [NO_BACKWARD_INFO]


def test_no_communication_no_modules_section(tmp_path):
    events = [step(1, 0, 1000), kernel(GEMM, 250, 100, stream=7)]
    report = analyze(write_trace(tmp_path, "rank0.json.gz", events, world_size=1), diagnose=False)
    assert report.modules is None
    assert "modules" not in report.to_dict()


def test_modules_round_trip_and_merge_in_rank_order(tmp_path):
    for rank, offset in ((0, 0.0), (1, 7.0)):
        events = [
            step(1, 0, 1000),
            frame("nn.Module: Net_0", 10, 900),
            launch(110, corr=1),
            kernel(AG, 200, 100 + offset, stream=20, corr=1),
        ]
        write_trace(tmp_path, f"rank{rank}.json.gz", events, rank=rank, world_size=2)
    report = analyze(tmp_path, diagnose=False)
    (row,) = report.modules.rows
    assert (row.count, row.time_us) == (2, 207.0) and report.modules.ranks == 2 and report.modules.rank_steps == 2
    back = Report.from_dict(json.loads(json.dumps(report.to_dict())))
    assert back.modules == report.modules
    assert merge_modules([None, report.modules]) == report.modules


def test_overlapped_each_is_the_measure_of_each_interval_in_the_union():
    busy = iv.union([0.0, 10.0, 30.0], [5.0, 20.0, 31.0])
    got = overlapped_each([-1.0, 3.0, 12.0, 25.0, 0.0], [2.0, 12.0, 40.0, 26.0, 100.0], busy)
    assert got.tolist() == [2.0, 4.0, 9.0, 0.0, 16.0]


def _shared_with_python() -> list:
    shared = shared_traces_dir()
    if shared is None:
        return []
    return [p for p in sorted(shared.rglob("*.json.gz")) if b'"python_function"' in _head(p)]


def _head(path) -> bytes:
    import gzip

    with gzip.open(path) as fh:
        return fh.read()


@pytest.mark.parametrize("path", _shared_with_python(), ids=lambda p: p.name)
def test_real_traces_with_python_stacks_get_module_rows_or_the_honest_note(path):
    """Every real trace with python_function events: its collectives are attributed to modules, each µs once
    (per kind the rows add up to at least the union of that kind's communication, to the sum of the durations),
    and what has no module is said; a trace without communication has no modules section."""
    report = analyze(path, diagnose=False)
    rank = report.ranks[0]
    if rank.collectives["all"].count == 0:
        assert report.modules is None
        return
    m = report.modules
    assert m is not None
    for kind, split in rank.collectives.items():
        if kind == "all" or not split.count:
            continue
        rows = [r for r in m.rows if r.kind == kind]
        assert sum(r.time_us for r in rows) >= split.time_us - 1e-6
        assert max(r.count for r in rows) <= split.count
    if any(r.module is None for r in m.rows):
        assert m.notes, "communication without a module, and no note saying why"
    if path.parent.name == "cpu-zero3-gloo":  # its forward all-gather is issued inside the model's module frame
        (gather,) = [r for r in m.rows if r.kind == "all_gather"]
        assert (gather.module, gather.phase, gather.source) == ("TinyNet_0", "forward", "module frame")
        assert {r.kind for r in m.rows if r.module is None} == {"reduce_scatter", "all_reduce"}
        assert m.notes == [NO_BACKWARD_INFO]


def test_a_real_trace_without_python_stacks_says_attribution_needs_them():
    shared = shared_traces_dir()
    if shared is None:
        pytest.skip("no ../shared/traces")
    (path,) = sorted((shared / "dlrm-8rank-v100").glob("worker0_*.json.gz"))
    report = analyze(path, diagnose=False)
    assert report.modules is not None and report.modules.notes == [NO_MODULE_INFO]
    assert all(r.module is None and r.source == "none" for r in report.modules.rows)


def test_packed_ranks_share_their_row_keys_and_keep_every_value(tmp_path):
    """The main process holds each rank's MODULES packed (overlapcheck/compact.py): same rows, keys held once."""
    from overlapcheck.compact import Compactor
    from overlapcheck.model import PackedModules, RankResult

    events = [
        step(1, 0, 1000),
        frame("nn.Module: Net_0", 10, 900),
        launch(110, corr=1),
        kernel(AG, 200, 100.125, stream=20, corr=1),
        kernel(GEMM, 250, 10, stream=7),
    ]
    report = analyze(write_trace(tmp_path, "rank0.json.gz", events, world_size=1), diagnose=False)
    modules = report.modules
    compactor = Compactor()
    packed = [compactor.result(RankResult(report.ranks[0], modules=modules)).modules for _ in range(3)]
    assert all(isinstance(p, PackedModules) for p in packed)
    assert all(p.rows == modules.rows and p.notes == tuple(modules.notes) for p in packed)
    assert packed[0].keys[0] is packed[2].keys[0]
    merged = merge_modules(packed)
    assert merged.ranks == 3 and merged.rows[0].time_us == 3 * 100.125 and merged.rows[0].count == 3


def test_html_module_tree_and_perfetto_args_name_the_modules(tmp_path):
    """The HTML page's module table is a tree by path with a timeline link per module; the page's timeline and
    the Perfetto file carry each collective's modules (escaped: the names come from the trace)."""
    from builders import Page

    from overlapcheck.report import renderer

    events = [
        step(1, 0, 2000),
        annotation(MODULE_ANNOTATION + "layers.3.attn (Attention)", 100, 50),
        launch(110, corr=1),
        annotation(MODULE_ANNOTATION + "layers.<b>x</b> (Evil)", 300, 50),
        launch(310, corr=2),
        kernel(AG, 200, 100, stream=20, corr=1),
        kernel(AG, 400, 100, stream=20, corr=2),
        kernel(GEMM, 250, 100, stream=7),
    ]
    report = analyze(write_trace(tmp_path, "rank0.json.gz", events, world_size=1), timelines=True)
    html = renderer("html").render(report)
    page = Page(html)
    assert "<b>x</b>" not in html.split('<script type="application/json"')[0]  # escaped in the table
    assert 'data-module="layers.3.attn"' in html and 'data-module="layers.3"' in html and 'data-module="layers"' in html
    assert "Attention" in page.visible()
    (tl,) = [b for b in page.json_blocks() if "lanes" in b]
    assert set(tl["modules"]) == {"layers.3.attn", "layers.<b>x</b>"}
    assert sorted(m for lane in tl["lanes"] for m in lane["m"] if m >= 0) == [0, 1]
    perfetto = json.loads(renderer("perfetto").render(report))
    events_out = perfetto["traceEvents"] if isinstance(perfetto, dict) else perfetto
    mods = sorted(e["args"]["module"] for e in events_out if "module" in e.get("args", {}))
    assert mods == ["layers.3.attn", "layers.<b>x</b>"]


def test_the_capture_ranges_are_no_call_site(tmp_path):
    """Without stacks a call site is the enclosing ops; the module ranges around DeepSpeed's hooks are not one of
    them, so a sync in every module's fetch stays one call site (one finding), not one per module."""
    from overlapcheck.diagnose.facts.callsite import CallSites
    from overlapcheck.trace.reader import load_trace

    events = [
        step(1, 0, 1000),
        annotation(MODULE_ANNOTATION + "layers.0 (Block)", 100, 100),
        {"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": 100, "tid": 100, "ts": 110, "dur": 20},
        {
            "ph": "X",
            "cat": "cpu_op",
            "name": GRAD_ANNOTATION + "layers.1 (Block)",
            "pid": 100,
            "tid": 100,
            "ts": 300,
            "dur": 100,
        },
        {"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": 100, "tid": 100, "ts": 310, "dur": 20},
    ]
    model = load_trace(str(write_trace(tmp_path, "rank0.json.gz", events, world_size=1)))
    sites = CallSites(model, np.array(model.names, dtype=object))
    assert sites.site(0, 115)["frame"] == sites.site(0, 315)["frame"] == "aten::item"
