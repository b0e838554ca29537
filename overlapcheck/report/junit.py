"""JUnit XML for the gate: one test case per check, a failed check as <failure>, so CI systems list them."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from overlapcheck.gate import Check
from overlapcheck.report.present import safe_line

SUITE = "overlapcheck.gate"


def render_junit(checks: list[Check], suite: str = SUITE) -> str:
    """The XML document (UTF-8 declaration included); ElementTree escapes markup, and control characters
    (which XML 1.0 cannot hold) are shown as `\\xNN`."""
    failures = sum(not c.passed for c in checks)
    root = ET.Element("testsuites", name=suite, tests=str(len(checks)), failures=str(failures), errors="0")
    ts = ET.SubElement(
        root, "testsuite", name=suite, tests=str(len(checks)), failures=str(failures), errors="0", skipped="0"
    )
    for c in checks:
        case = ET.SubElement(ts, "testcase", classname=suite, name=c.id)
        text = safe_line(f"{c.name}: measured {c.measured}, limit {c.limit}" + (f" ({c.detail})" if c.detail else ""))
        if c.passed:
            ET.SubElement(case, "system-out").text = text
        else:
            failure = ET.SubElement(
                case, "failure", message=safe_line(f"{c.name}: {c.measured}, limit {c.limit}"), type="threshold"
            )
            failure.text = text
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
