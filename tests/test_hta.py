"""overlapcheck vs HolisticTraceAnalysis 0.5.0 `get_comm_comp_overlap` on the real traces (docs/hta-comparison.md).

For every rank: HTA's number equals ours, or the difference is explained by HTA rules that the test isolates.
The proof has three legs: (1) tests/reference.py re-implements HTA rule by rule and reproduces HTA's published
number exactly; (2) switching off only the rules that move the number gives ours; (3) HTA itself, with those
behaviours turned off (`include_last_profiler_step=True`, `HTA_DISABLE_NS_ROUNDING=1`), gives ours. Two more
tests check each rule against HTA's own parsed DataFrame.
"""

from __future__ import annotations

import math
import os
import warnings
from functools import cache
from typing import Any

import pytest
import reference as R
from builders import shared_traces_dir

from overlapcheck.pipeline import analyze

pytestmark = [pytest.mark.hta, pytest.mark.filterwarnings("ignore:::hta")]

SHARED_TRACES = shared_traces_dir()
if SHARED_TRACES is None:
    pytest.skip("../shared/traces is not present", allow_module_level=True)
try:  # the package only: hta.trace_analysis (pandas, plotly) is imported by the tests that run it
    import hta  # noqa: F401
except ImportError:
    pytest.skip("HolisticTraceAnalysis is not importable", allow_module_level=True)

TRACES = str(SHARED_TRACES)
ROWS = R.manifest_rows(os.path.join(TRACES, "MANIFEST.md"))
RANKS = [(row, path) for row in ROWS for path in R.files_of(TRACES, row.path)]
IDS = [os.path.relpath(p, TRACES) for _, p in RANKS]
TOL = 0.006  # HTA prints percentages rounded to 2 decimals


@cache
def raw(path: str) -> R.Trace:
    return R.load(path)


@cache
def ours_pct(path: str) -> float:
    report = analyze(path, jobs=1)
    return 100 * report.ranks[0].collectives["all"].overlap


def job_files(row: R.ManifestRow) -> list[str]:
    return R.files_of(TRACES, row.path, lambda p: raw(p).rank)


def job_step_names(row: R.ManifestRow) -> int:
    """Distinct ProfilerStep names in the whole job: HTA's last-step filter looks at its job-wide symbol table."""
    return len(
        {
            e["name"]
            for p in job_files(row)
            for e in raw(p).events
            if "ProfilerStep" in str(e.get("name", "")) and e.get("dur") is not None
        }
    )


def emulate(row: R.ManifestRow, path: str, **rules: bool) -> float:
    result = R.hta_overlap(raw(path), R.HtaRules(**rules), job_step_names(row))
    assert result.pct is not None
    return result.pct


def run_hta(folders: dict[str, str], include_last_step: bool, ns_rounding: bool) -> dict[str, Any]:
    """HTA on each job folder: {job: (TraceAnalysis, {rank: pct})}."""
    from hta.trace_analysis import TraceAnalysis

    out = {}
    with pytest.MonkeyPatch.context() as mp:
        if not ns_rounding:
            mp.setenv("HTA_DISABLE_NS_ROUNDING", "1")
        for job, folder in folders.items():
            analysis = TraceAnalysis(trace_dir=folder, include_last_profiler_step=include_last_step)
            table = analysis.get_comm_comp_overlap(visualize=False)
            out[job] = (analysis, dict(zip(table["rank"], table["comp_comm_overlap_pctg"], strict=True)))
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """One folder per job (HTA reads a folder of rank files), the traces symlinked in."""
    root = tmp_path_factory.mktemp("hta_jobs")
    out = {}
    for row in ROWS:
        folder = root / row.path.replace("/", "_")
        folder.mkdir()
        for path in job_files(row):
            (folder / os.path.basename(path)).symlink_to(path)
        out[row.path] = str(folder)
    return out


@pytest.fixture(scope="module", autouse=True)
def _free_parsed_traces():
    yield
    raw.cache_clear()
    ours_pct.cache_clear()


@pytest.fixture(scope="module")
def hta_default(folders):
    return run_hta(folders, include_last_step=False, ns_rounding=True)


@pytest.fixture(scope="module")
def hta_aligned(folders):
    """HTA with the two behaviours that differ from docs/metrics.md turned off through its own switches."""
    return run_hta(folders, include_last_step=True, ns_rounding=False)


def hta_pct(results: dict[str, Any], row: R.ManifestRow, path: str) -> float:
    rank = raw(path).rank
    return float(results[row.path][1][rank])


@pytest.mark.parametrize(("row", "path"), RANKS, ids=IDS)
def test_hta_reproduces_the_manifest_hta_column(hta_default, row, path):
    i = job_files(row).index(path)
    assert hta_pct(hta_default, row, path) == pytest.approx(row.hta_pct[i], abs=TOL)


@pytest.mark.parametrize(("row", "path"), RANKS, ids=IDS)
def test_reference_with_hta_rules_is_hta(hta_default, row, path):
    assert emulate(row, path) == pytest.approx(hta_pct(hta_default, row, path), abs=TOL)
    # and with no HTA rule it is overlapcheck
    no_rules = {rule: False for rule in R.ALL_HTA_RULES}
    assert emulate(row, path, **no_rules) == pytest.approx(ours_pct(path), abs=0.01)


@pytest.mark.parametrize(("row", "path"), RANKS, ids=IDS)
def test_hta_equals_ours_or_the_difference_is_explained(hta_default, hta_aligned, row, path):
    hta, ours = hta_pct(hta_default, row, path), ours_pct(path)
    # HTA itself, with its last-step filter and ns rounding switched off, is overlapcheck on every trace
    assert hta_pct(hta_aligned, row, path) == pytest.approx(ours, abs=TOL)
    if abs(hta - ours) <= TOL:
        return
    alone = {rule: emulate(row, path, **{r: r == rule for r in R.ALL_HTA_RULES}) for rule in R.ALL_HTA_RULES}
    causes = {rule for rule, pct in alone.items() if abs(pct - ours) > 0.01}
    assert causes, f"HTA {hta} vs ours {ours} and no HTA rule moves the number"
    assert causes <= {"ns_rounding", "last_step_filter"}
    only_causes = emulate(row, path, **{r: r in causes for r in R.ALL_HTA_RULES})
    assert only_causes == pytest.approx(hta, abs=TOL)
    all_but_causes = emulate(row, path, **{r: r not in causes for r in R.ALL_HTA_RULES})
    assert all_but_causes == pytest.approx(ours, abs=0.01)
    if abs(hta - ours) > 0.5:
        assert "last_step_filter" in causes


def test_each_hta_switch_alone_matches_its_rule(folders, hta_default):
    """On jobs with fractional timestamps (both HTA rules matter), HTA with one switch flipped equals the reference
    with only the other rule on."""
    jobs = [row for row in ROWS if any(R.has_float_ts(raw(p)) for p in job_files(row))]
    assert jobs, "no real trace with fractional timestamps"
    selected = {row.path: folders[row.path] for row in jobs}
    rounding_only = run_hta(selected, include_last_step=True, ns_rounding=True)
    filter_only = run_hta(selected, include_last_step=False, ns_rounding=False)
    for row in jobs:
        for path in job_files(row):
            rules = {r: False for r in R.ALL_HTA_RULES}
            assert hta_pct(rounding_only, row, path) == pytest.approx(
                emulate(row, path, **{**rules, "ns_rounding": True}), abs=TOL
            )
            assert hta_pct(filter_only, row, path) == pytest.approx(
                emulate(row, path, **{**rules, "last_step_filter": True}), abs=TOL
            )
            assert hta_pct(filter_only, row, path) != pytest.approx(hta_pct(hta_default, row, path), abs=TOL)


@pytest.mark.parametrize(("row", "path"), RANKS, ids=IDS)
def test_the_step_hta_drops_is_complete(row, path):
    """Where HTA drops the last step, that step has as many kernels and NCCL kernels as every other step: nothing
    was cut off, HTA's filter only discards data."""
    per_step = R.kernels_per_step(raw(path))
    if job_step_names(row) < 2:
        assert len(per_step) <= 1
        return
    assert len(set(per_step.values())) == 1, per_step


def _kernel_rows(analysis, rank: int):
    df = analysis.t.traces[rank]
    names = analysis.t.symbol_table.sym_table
    kernel_cat = analysis.t.symbol_table.get_sym_id_map().get("kernel", -2)
    rows = df[(df["cat"] == kernel_cat) & (df["stream"] >= 0)]
    return rows, names


@pytest.mark.parametrize(("row", "path"), RANKS, ids=IDS)
def test_hta_last_step_filter_is_what_hta_does(hta_default, row, path):
    """HTA's parsed kernels are exactly those launched before the job's last ProfilerStep (when it has two or more
    step names), the rule the reference applies."""
    analysis, _ = hta_default[row.path]
    trace = raw(path)
    rows, _ = _kernel_rows(analysis, trace.rank)
    keep = R.launched_before_last_step(trace, R.has_float_ts(trace)) if job_step_names(row) >= 2 else None
    expected = sorted(
        k.args["correlation"] for k in trace.kernels(("kernel",)) if keep is None or k.args["correlation"] in keep
    )
    assert sorted(rows["correlation"].tolist()) == expected
    if keep is not None:
        assert len(expected) < len(trace.kernels(("kernel",)))


@pytest.mark.parametrize(("row", "path"), RANKS, ids=IDS)
def test_hta_ns_rounding_is_what_hta_does(hta_default, row, path):
    """With fractional timestamps HTA keeps [ceil(ts), floor(ts + dur)) of each kernel; integer traces are intact."""
    analysis, _ = hta_default[row.path]
    trace = raw(path)
    rows, _ = _kernel_rows(analysis, trace.rank)
    by_corr = {k.args["correlation"]: k for k in trace.kernels(("kernel",))}
    rounding = R.has_float_ts(trace)
    for corr, dur in zip(rows["correlation"].tolist(), rows["dur"].tolist(), strict=True):
        k = by_corr[corr]
        want = math.floor(k.end) - math.ceil(k.start) if rounding else k.end - k.start
        assert dur == want


def test_no_communication_hta_nan_ours_null(tmp_path):
    """A single-GPU trace without NCCL: HTA divides 0 by 0 (NaN); overlapcheck reports null with a note."""
    from hta.trace_analysis import TraceAnalysis

    path = os.path.join(TRACES, "edge-cases", "triton_example.json.gz")
    if not os.path.isfile(path):
        pytest.skip("edge-cases/triton_example.json.gz is not present")
    (tmp_path / os.path.basename(path)).symlink_to(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = TraceAnalysis(trace_dir=str(tmp_path)).get_comm_comp_overlap(visualize=False)
    assert any(issubclass(w.category, RuntimeWarning) and "divide" in str(w.message) for w in caught)
    assert math.isnan(float(table["comp_comm_overlap_pctg"].iloc[0]))
    rank = analyze(path, jobs=1).ranks[0]
    assert rank.collectives["all"].overlap is None
    assert any("overlap is null" in n for n in rank.notes)
