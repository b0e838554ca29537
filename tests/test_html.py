"""The HTML report: content, escaping of trace strings, embedded data, size caps and atomic writing."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import time
from html.parser import HTMLParser

import pytest
from test_html_fixtures import XSS_IMG, XSS_SCRIPT, make_finding, make_report, make_timeline

from overlapcheck.errors import UserError
from overlapcheck.report.html import (
    MAX_EVENTS_TOTAL,
    MIN_EVENTS_RANK,
    config_patch,
    env_lines,
    rank_ranges,
    render_html,
    write_html,
)


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


def hostile_report() -> dict:
    """Every string a trace or a user can control carries an HTML/JS payload."""
    report = make_report(
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
    report["ranks"][1]["source"] = XSS_SCRIPT
    report["ranks"][1]["host"] = XSS_IMG
    report["ranks"][2]["notes"] = [XSS_SCRIPT]
    report["run"] = {"launcher": XSS_IMG}
    report["timelines"] = {
        str(r): make_timeline(seed=r, kernel_name=XSS_SCRIPT if r % 2 else XSS_IMG) for r in range(4)
    }
    report["timelines"]["3"]["lanes"][0]["label"] = XSS_SCRIPT
    return report


# -------------------------------------------------------------------------------------------- content


def test_page_has_every_section_and_the_numbers():
    report = make_report(4, overlaps=[0.9, 0.85, 0.6, 0.88], compute=[80_000.0] * 3 + [95_000.0])
    report["timelines"] = {str(r): make_timeline(seed=r) for r in range(4)}
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
    assert "Reduce-scatter runs after the last backward kernel" in text and "4.2 ms / step" in text
    rows = [a for t, a in page.tags if t == "tr" and a.get("class") == "worst"]
    assert len(rows) == 1
    assert "+18.8%" in text  # rank 3 computes 95 ms vs a median of 80 ms: a possible straggler
    options = [a["value"] for t, a in page.tags if t == "option"]
    assert options == ["0", "1", "2", "3"]
    config = page.json_blocks()[0]
    assert config["initialRank"] == 2  # the timeline opens on the worst rank


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
    html = render_html(make_report(2, findings=[costly, cheap]))
    block = re.search(r'id="oc-patch-all">(.*?)</pre>', html, re.S).group(1).replace("&#34;", '"')
    assert json.loads(block) == {"zero_optimization": {"reduce_bucket_size": 3}, "x": {"y": 2}}


def test_empty_and_communication_free_reports_render():
    empty = make_report(1, findings=[])
    empty["ranks"], empty["summary"] = [], {"ranks": 0, "metrics": {}}
    text = Page(render_html(empty)).visible()
    assert "No communication was measured" in text and "No ranks in this report" in text
    assert "carries no kernel intervals" in text
    quiet = make_report(2, findings=[])
    for rank in quiet["ranks"]:
        for split in rank["collectives"].values():
            split.update(count=0, time_us=0.0, overlapped_us=0.0, exposed_us=0.0, overlap=None)
        rank["exposed_share"] = None
    text = Page(render_html(quiet)).visible()
    assert "No communication kernels in this report" in text and "No findings" in text


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
    report = make_report(1)
    report["timelines"] = {"0": make_timeline(n_compute=60_000, n_comm=200)}
    data = [b for b in Page(render_html(report)).json_blocks() if "lanes" in b][0]
    kept = sum(len(ln["s"]) for ln in data["lanes"])
    assert kept == data["n"] and data["omitted"] == 60_000 + 201 + 6 - kept
    comm = [ln for ln in data["lanes"] if ln["kind"] == "comm"][0]
    assert len(comm["s"]) == 201  # every communication kernel survives the cap
    assert comm["s"] == sorted(comm["s"])  # sorted for the binary search


def test_64_ranks_stay_light():
    report = make_report(64, overlaps=[0.7] * 64)
    report["timelines"] = {str(r): make_timeline(seed=r, n_compute=4_000, n_comm=300) for r in range(64)}
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
    write_html(make_report(2), str(target), force=False)
    assert target.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    target.write_text("keep me")
    with pytest.raises(UserError, match="--force"):
        write_html(make_report(2), str(target), force=False)
    assert target.read_text() == "keep me"
    write_html(make_report(2), str(target), force=True)
    assert "overlapcheck" in target.read_text(encoding="utf-8")
    assert sorted(os.listdir(tmp_path)) == ["report.html"]  # no temp file left behind
    with pytest.raises(UserError, match="folder does not exist"):
        write_html(make_report(1), str(tmp_path / "missing" / "r.html"), force=False)


def test_tolerates_nulls_and_partial_documents():
    minimal = Page(render_html({"schema": "overlapcheck.report/1", "ranks": []}))
    assert "No ranks in this report" in minimal.visible()
    report = make_report(2)
    report.update(tool=None, summary=None, findings_explain_share=None)
    report["ranks"][0].update(host=None, exposed_share=None, steps=[])
    report["findings"][0].update(fix=None, evidence=None, cost_us=None)
    report["timelines"] = {
        "0": {"step": None, "lanes": [], "events": [], "names": [], "exposed": []},
        "not-a-rank": {},
        "1": {"events": [[0, "bad", 1, "compute", 0], None]},
    }
    page = Page(render_html(report))
    assert "Reduce-scatter runs after the last backward kernel" in page.visible()
    assert [b["rank"] for b in page.json_blocks() if "lanes" in b] == [0, 1]
