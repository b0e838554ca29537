"""The HTML report: content, escaping of trace strings, embedded data, size caps and atomic writing."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import os
import re
import time

import pytest
from builders import (
    XSS_IMG,
    XSS_SCRIPT,
    Page,
    as_report,
    make_finding,
    make_report,
    make_timeline,
    report_doc,
    summary_doc,
)

from overlapcheck.errors import UserError
from overlapcheck.fsutil import atomic_write
from overlapcheck.model import Report, ReportFormatError, Summary, Timeline, TimelineLane, Tool
from overlapcheck.report.html import MAX_EVENTS_TOTAL, MIN_EVENTS_RANK, HtmlRenderer, build_view
from overlapcheck.report.present import combined_patch, config_patch, env_lines, rank_ranges


def render_html(report: Report) -> str:
    return HtmlRenderer().render(report)


def hostile_report() -> Report:
    """Every string a trace or a user can control carries an HTML/JS payload."""
    doc = report_doc(
        4,
        findings=[
            make_finding(
                title=f"Kernel {XSS_IMG} is exposed",
                why=XSS_SCRIPT,
                evidence={"kernel": XSS_SCRIPT, "stack": [XSS_IMG], XSS_IMG: 1.5},
                fix={"config": {f"zero_optimization.{XSS_IMG}": XSS_SCRIPT}, "env": {"NCCL_X": XSS_SCRIPT}},
            )
        ],
        errors=[{"source": XSS_SCRIPT, "error": XSS_IMG}],
    )
    doc["ranks"][1]["source"] = XSS_SCRIPT
    doc["ranks"][1]["host"] = XSS_IMG
    doc["ranks"][2]["notes"] = [XSS_SCRIPT]
    doc["run"] = {"launcher": XSS_IMG}
    timelines = {
        r: make_timeline(
            seed=r, kernel_name=XSS_SCRIPT if r % 2 else XSS_IMG, compute_label=XSS_SCRIPT if r == 3 else "stream 7"
        )
        for r in range(4)
    }
    return as_report(doc, timelines)


def empty_report() -> Report:
    """A report without ranks (every input unreadable, or none given)."""
    doc = report_doc(1, findings=[])
    doc["ranks"], doc["summary"] = [], {"ranks": 0, "metrics": {}}
    return as_report(doc)


# -------------------------------------------------------------------------------------------- content


def test_page_has_every_section_and_the_numbers():
    straggler = make_finding(
        rule="straggler",
        severity="warning",
        cost_us=1_500.0,
        title="Rank 3 arrives last at the collectives",
        ranks=[3],
        fix={},
        paces=True,  # as the diagnosis marks a straggler: the renderer reads this, not the rule id
    )
    report = make_report(
        4,
        overlaps=[0.9, 0.85, 0.6, 0.88],
        compute=[80_000.0] * 3 + [95_000.0],
        findings=[make_finding(), straggler],
        timelines={r: make_timeline(seed=r) for r in range(4)},
    )
    page = Page(render_html(report))
    ids = {a.get("id") for _, a in page.tags}
    assert {
        "verdict",
        "ranks",
        "collectives",
        "timeline",
        "findings",
        "crossrank",
        "oc-tl-canvas",
        "oc-rank-table",
        "oc-bars",
        "oc-config",
    } <= ids
    text = page.visible()
    assert "86.5%" in text  # median overlap of 0.9, 0.85, 0.6, 0.88
    assert "rank 2" in text and "60.0% hidden" in text  # worst rank
    # costs per step in the terminal's format: ms with two decimals, "ms/step"
    assert "Reduce-scatter runs after the last backward kernel" in text and "4.20 ms/step" in text
    rows = [a for t, a in page.tags if t == "tr" and a.get("class") == "worst"]
    assert len(rows) == 1
    # the stragglers are the report's straggler findings, with their cost per step and ranks
    assert "Stragglers" in text and "Rank 3 arrives last at the collectives : 1.50 ms/step (rank 3)" in text
    # rank 3 computes 95 ms vs 80 ms: its step (100.6 ms) is 18.4 % longer than rank 0's (85 ms)
    assert "The slowest rank's step is 18.4% longer than the fastest's" in text
    options = [a["value"] for t, a in page.tags if t == "option"]
    assert options == ["0", "1", "2", "3"]
    config = page.json_blocks()[0]
    assert config["initialRank"] == 2  # the timeline opens on the worst rank
    # the rank table: lowest overlap first, times per profiled step (each rank has 2 steps)
    view = build_view(report)
    assert [r["rank"] for r in view["ranks"]] == [2, 1, 3, 0]
    by_rank = {r["rank"]: r for r in view["ranks"]}
    assert by_rank[0]["step_time_us"] == pytest.approx(85_000.0 / 2)
    assert by_rank[3]["compute_us"] == pytest.approx(95_000.0 / 2)
    assert by_rank[2]["exposed_us"] == pytest.approx(30_000.0 * 0.4 / 2)  # 40 % of 30 ms exposed, over 2 steps
    assert by_rank[2]["idle_us"] == pytest.approx(2_000.0)  # idle is the total


def test_no_straggler_finding_means_no_straggler():
    # rank 3 computes longer, but without a straggler finding the page names no straggler
    report = make_report(4, overlaps=[0.9, 0.85, 0.6, 0.88], compute=[80_000.0] * 3 + [95_000.0])
    text = Page(render_html(report)).visible()
    assert "None: no rank kept the others waiting" in text


def test_findings_show_a_nested_ds_config_patch_and_env_lines():
    page = Page(render_html(make_report(2)))
    pres = {a.get("id"): None for t, a in page.tags if t == "pre"}
    assert "oc-patch-0" in pres and "oc-env-0" in pres and "oc-patch-all" in pres
    html = render_html(make_report(2))
    patch = re.search(r'<pre class="code json" id="oc-patch-0">(.*?)</pre>', html, re.S).group(1)
    assert json.loads(patch.replace("&#34;", '"')) == {
        "zero_optimization": {"reduce_bucket_size": 50000000, "overlap_comm": True}
    }
    assert "unset CUDA_DEVICE_MAX_CONNECTIONS" in html and "export NCCL_ALGO=Ring" in html
    assert "pip install &#39;deepspeed&gt;=0.14.3&#39;" in html


def test_config_patch_and_helpers():
    assert config_patch({"a.b.c": 1, "a.d": 2, "e": 3}) == {"a": {"b": {"c": 1}, "d": 2}, "e": 3}
    assert config_patch({"a": 1, "a.b": 2}) == {"a": {"b": 2}}  # a nested key wins over a scalar
    assert config_patch({"a.b": 2, "a": 1}) == {"a": {"b": 2}}
    assert env_lines({"X": None, "Y": "a b", "Z": 1}) == ["unset X", "export Y='a b'", "export Z=1"]
    assert rank_ranges([5, 0, 1, 2, 7, 8, 2]) == "0-2, 5, 7-8"
    assert rank_ranges([]) == ""


def test_combined_patch_prefers_the_costlier_finding():
    cheap = make_finding(cost_us=10.0, fix={"config": {"zero_optimization.reduce_bucket_size": 1, "x.y": 2}})
    costly = make_finding(cost_us=900.0, fix={"config": {"zero_optimization.reduce_bucket_size": 3}})
    report = make_report(2, findings=[costly, cheap])
    html = render_html(report)
    block = re.search(r'id="oc-patch-all">(.*?)</pre>', html, re.S).group(1).replace("&#34;", '"')
    assert json.loads(block) == {"zero_optimization": {"reduce_bucket_size": 3}, "x": {"y": 2}}
    assert combined_patch(report.findings) == {"zero_optimization": {"reduce_bucket_size": 3}, "x": {"y": 2}}
    assert combined_patch(make_report(2, findings=[make_finding(fix={"env": {"X": "1"}})]).findings) is None
    assert combined_patch([]) is None


def test_empty_and_communication_free_reports_render():
    text = Page(render_html(empty_report())).visible()
    assert "No communication was measured" in text and "No ranks in this report" in text
    assert "carries no kernel intervals" in text
    quiet = report_doc(2, findings=[])
    for rank in quiet["ranks"]:
        for collectives in [rank["collectives"], *(s["collectives"] for s in rank["steps"])]:
            for split in collectives.values():
                split.update(count=0, time_us=0.0, overlapped_us=0.0, exposed_us=0.0, overlap=None)
        rank["exposed_share"] = None
        for s in rank["steps"]:
            s["exposed_share"] = None
    quiet["summary"] = summary_doc(quiet["ranks"])
    text = Page(render_html(as_report(quiet))).visible()
    assert "No communication kernels in this report" in text and "No findings" in text
    assert "No communication was measured" in text


# ------------------------------------------------------------------------------------------- escaping


def test_trace_strings_render_as_text_never_markup():
    html = render_html(hostile_report())
    page = Page(html)
    assert not [t for t, _ in page.tags if t == "img"]
    scripts = [a for a, _ in page.scripts]
    inline = [a for a in scripts if a.get("type") != "application/json"]
    assert len(inline) == 1 and not inline[0]  # only our own script, no injected <script>
    assert all(not any(k.startswith("on") for k in a) for _, a in page.tags)  # no event handler attributes
    text = page.visible()
    assert XSS_IMG in text and XSS_SCRIPT in text  # shown, as text
    assert "alert(1)" not in "".join(b for a, b in page.scripts if a.get("type") != "application/json")


def test_embedded_json_round_trips_payload_names():
    page = Page(render_html(hostile_report()))
    for attrs, body in page.scripts:
        if attrs.get("type") == "application/json":
            assert "</" not in body and "<" not in body
    timelines = [b for b in page.json_blocks() if "lanes" in b]
    assert len(timelines) == 4
    assert XSS_SCRIPT in timelines[1]["names"] and XSS_IMG in timelines[0]["names"]
    assert XSS_SCRIPT in [ln["label"] for ln in timelines[3]["lanes"]]


def test_content_security_policy_allows_only_our_inline_code():
    html = render_html(make_report(2))
    page = Page(html)
    csp = next(a["content"] for t, a in page.tags if t == "meta" and a.get("http-equiv"))
    js = next(b for a, b in page.scripts if a.get("type") != "application/json")
    css = re.search(r"<style>(.*?)</style>", html, re.S).group(1)

    def digest(text: str) -> str:
        return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"

    assert f"script-src {digest(js)};" in csp and f"style-src {digest(css)};" in csp
    assert "default-src 'none'" in csp
    assert not re.search(r"\sstyle=", html)  # a style attribute would be blocked by the policy
    assert not re.search(r"(src|href)=\"(https?:)?//", html)  # nothing loaded from the network


# ------------------------------------------------------------------------------------------ size, caps


def test_timeline_is_capped_and_keeps_communication():
    report = make_report(1, timelines={0: make_timeline(n_compute=60_000, n_comm=200)})
    data = [b for b in Page(render_html(report)).json_blocks() if "lanes" in b][0]
    kept = sum(len(ln["s"]) for ln in data["lanes"])
    assert kept == data["n"] and data["omitted"] == 60_000 + 201 + 6 - kept
    comm = [ln for ln in data["lanes"] if ln["kind"] == "comm"][0]
    assert len(comm["s"]) == 201  # every communication kernel survives the cap
    assert comm["s"] == sorted(comm["s"])  # sorted for the binary search


def test_64_ranks_stay_light():
    report = make_report(
        64,
        overlaps=[0.7] * 64,
        timelines={r: make_timeline(seed=r, n_compute=4_000, n_comm=300) for r in range(64)},
    )
    start = time.perf_counter()
    html = render_html(report)
    elapsed = time.perf_counter() - start
    blocks = [b for b in Page(html).json_blocks() if "lanes" in b]
    assert len(blocks) == 64
    assert sum(b["n"] for b in blocks) <= max(MAX_EVENTS_TOTAL, 64 * MIN_EVENTS_RANK)
    assert len(html.encode()) < 12_000_000, len(html)
    assert elapsed < 20, elapsed


# -------------------------------------------------------------------------------------------- writing


def test_write_html_is_atomic_and_refuses_to_overwrite(tmp_path):
    target = tmp_path / "report.html"
    atomic_write(str(target), render_html(make_report(2)), force=False)
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    target.write_text("keep me")
    with pytest.raises(UserError, match="--force"):
        atomic_write(str(target), render_html(make_report(2)), force=False)
    assert target.read_text() == "keep me"
    atomic_write(str(target), render_html(make_report(2)), force=True)
    assert "overlapcheck" in target.read_text(encoding="utf-8")
    assert sorted(os.listdir(tmp_path)) == ["report.html"]  # no temp file left behind
    with pytest.raises(UserError, match="folder does not exist"):
        atomic_write(str(tmp_path / "missing" / "r.html"), render_html(make_report(1)), force=False)


def test_tolerates_nulls_and_bad_timeline_rows():
    bare = Report(
        tool=Tool("overlapcheck", "0.1.0"),
        run=None,
        ranks=[],
        summary=Summary(0, {}),
        findings=[],
        findings_explain_share=None,
        errors=[],
    )
    assert "No ranks in this report" in Page(render_html(bare)).visible()
    doc = report_doc(2)
    doc["findings_explain_share"] = None
    doc["ranks"][0].update(host=None, exposed_share=None, steps=[])
    doc["findings"][0].update(fix={}, evidence={}, steps=[])
    lanes = [TimelineLane(0, "stream 7", "compute")]
    timelines = {
        0: Timeline(step=None, t0=0.0, duration=0.0, lanes=[], events=[], names=[], exposed=[]),
        1: Timeline(
            step=None,
            t0=0.0,
            duration=10.0,
            lanes=lanes,
            events=[[0, "bad", 1, "compute", 0], [5, 1.0, 1.0, "compute", 0], [0, 1.0], [0, 2.0, 3.0, "compute", 7]],
            names=[],
            exposed=[[4.0, 3.0], ["x", 9.0]],
        ),
    }
    report = as_report(doc, timelines)
    # numbers the analysis could not compute (NaN, infinity) are shown as n/a, never break the page
    nan_rank = dataclasses.replace(report.ranks[1], exposed_share=float("nan"), idle_us=float("inf"))
    report = dataclasses.replace(report, ranks=[report.ranks[0], nan_rank])
    page = Page(render_html(report))
    assert "Reduce-scatter runs after the last backward kernel" in page.visible()
    blocks = [b for b in page.json_blocks() if "lanes" in b]
    assert [b["rank"] for b in blocks] == [0, 1]
    assert blocks[1]["n"] == 1 and blocks[1]["names"] == [] and blocks[1]["exposed"] == []  # only the valid row
    rows = {r["rank"]: r for r in build_view(report)["ranks"]}
    assert rows[1]["exposed_share"] is None and rows[1]["idle_us"] is None
    assert rows[0]["host"] is None and rows[0]["steps"] == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(tool=None), "malformed report: tool is not an object"),
        (lambda d: d.update(summary=None), "malformed report: summary is not an object"),
        (lambda d: d["findings"][0].update(cost_us=None), "findings[0].cost_us is not a finite number"),
        (lambda d: d["findings"][0].update(fix=None), "findings[0].fix is not an object"),
        (lambda d: d["ranks"][0].pop("collectives"), "ranks[0].collectives is missing"),
    ],
)
def test_partial_documents_are_refused_before_rendering(change, message):
    """The renderer reads a Report; a document of the wrong shape stops at Report.from_dict with one line."""
    doc = report_doc(2)
    change(doc)
    with pytest.raises(ReportFormatError, match=re.escape(message)):
        as_report(doc)
