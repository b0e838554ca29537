"""Strings from a trace reach people through every output: none may act on the terminal (ANSI and OSC escapes),
break an XML or Markdown document, or crash the HTML page with numbers JSON cannot hold."""

from __future__ import annotations

import dataclasses
import html
import math
import xml.etree.ElementTree as ET

from builders import make_finding, make_report

from overlapcheck.gate import GateConfig, run_checks
from overlapcheck.model import InputError
from overlapcheck.report import renderer
from overlapcheck.report.junit import render_junit
from overlapcheck.report.markdown import render_gate_markdown
from overlapcheck.report.present import safe, safe_line

ESCAPES = "\x1b]0;pwned\x07\x1b[2J\x1b]8;;http://evil.example\x1b\\link\x1b]8;;\x1b\\\x9b31m\r\x08\u202egpj.exe\u2066"
BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def _hostile_report():
    finding = make_finding(title=f"Host-blocking sync in {ESCAPES}", why=f"why {ESCAPES}")
    report = make_report(2, findings=[finding], errors=[{"source": f"rank{ESCAPES}.json", "error": f"bad {ESCAPES}"}])
    ranks = [dataclasses.replace(r, host=f"node{ESCAPES}", notes=[f"note {ESCAPES}"]) for r in report.ranks]
    return dataclasses.replace(report, ranks=ranks)


def _no_control(text: str) -> None:
    bad = [c for c in text if (ord(c) < 32 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F or c in BIDI]
    assert not bad, sorted(set(bad))


def test_safe_shows_control_characters_instead_of_running_them() -> None:
    assert safe("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert safe_line("a\nb\tc\x07") == "a b c\\x07"
    assert safe("kernel<float>") == "kernel<float>"  # printable text is left alone
    # a right-to-left override would show "report\u202egpj.exe" as "reportexe.jpg"
    assert safe("a\u202eb\u2066c\u200fd") == "a\\u202eb\\u2066c\\u200fd"
    assert safe("ünïcödé 名前") == "ünïcödé 名前"


def test_text_and_markdown_outputs_carry_no_control_characters() -> None:
    report = _hostile_report()
    for name in ("text", "markdown"):
        out = renderer(name).render(report)
        _no_control(str(out))
        assert "pwned" in str(out)  # shown, not dropped: the user sees what the trace holds


def test_gate_outputs_carry_no_control_characters() -> None:
    report = _hostile_report()
    checks = run_checks(report, GateConfig(min_overlap={"all": 0.5}))
    junit = render_junit(checks)
    ET.fromstring(junit.split("\n", 1)[1])  # well-formed XML
    _no_control(junit)
    _no_control(render_gate_markdown(checks, f"r{ESCAPES}.json"))


def test_html_survives_infinite_and_nan_numbers() -> None:
    report = _hostile_report()
    rank = dataclasses.replace(report.ranks[0], span_us=math.inf, idle_us=math.nan, exposed_share=math.inf)
    finding = dataclasses.replace(report.findings[0], cost_us=math.inf, evidence={"x": math.inf, "y": [math.nan]})
    report = dataclasses.replace(
        report, ranks=[rank, *report.ranks[1:]], findings=[finding], errors=[InputError("a", "b")]
    )
    page = renderer("html").render(report)
    body = page.split("<script", 1)[0]  # the page's own script mentions NaN
    assert "Infinity" not in page and "NaN" not in body and "inf%" not in body
    csp = html.unescape(page.split('http-equiv="Content-Security-Policy" content="', 1)[1].split('"', 1)[0])
    assert "default-src 'none'" in csp and "base-uri 'none'" in csp and "form-action 'none'" in csp
