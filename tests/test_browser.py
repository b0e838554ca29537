"""The HTML report in headless Chromium: loads from file:// with no console errors, no injected code runs,
the timeline draws and responds, and screenshots land in test-artifacts/ for people to look at."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from builders import (
    XSS_IMG,
    XSS_SCRIPT,
    as_report,
    make_finding,
    make_report,
    make_timeline,
    report_doc,
    shared_traces_dir,
)

from overlapcheck.model import Report
from overlapcheck.report.html import HtmlRenderer

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
SHARED = shared_traces_dir()
DLRM = SHARED / "dlrm-8rank-v100" if SHARED is not None else None
# records alert/confirm/prompt instead of blocking on them; runs before any page script (exempt from CSP)
TRAP = (
    "window.__dialogs = [];"
    "['alert', 'confirm', 'prompt'].forEach(function (n) {"
    "  window[n] = function (m) { window.__dialogs.push(n + ':' + String(m)); }; });"
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
        reason="needs chromium and chromedriver (Debian: chromium, chromium-driver)",
    ),
]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": TRAP})
    yield drv
    drv.quit()


def open_page(driver, path: Path) -> None:
    driver.get_log("browser")  # drop messages of earlier pages
    driver.get(path.as_uri())
    driver.execute_script("return document.readyState")


def console_errors(driver) -> list[dict]:
    return [e for e in driver.get_log("browser") if e.get("level") in ("SEVERE", "ERROR")]


def render_html(report: Report) -> str:
    return HtmlRenderer().render(report)


def showcase_report() -> Report:
    """8 ranks, a straggler, two findings, timelines; rank 2's kernel names and rank 1's file are payloads."""
    doc = report_doc(
        8,
        overlaps=[0.72, 0.7, 0.55, 0.74, 0.7, 0.71, 0.69, 0.73],
        compute=[80_000.0] * 7 + [91_000.0],
        findings=[
            make_finding(),
            make_finding(
                rule="straggler",
                severity="warning",
                cost_us=1_100.0,
                title=f"Rank 7 computes 14% longer than the median {XSS_IMG}",
                why="the other ranks wait for it inside every collective",
                ranks=[7],
                evidence={"compute_us": 91000.0, "median_compute_us": 80000.0},
                fix={"env": {"NCCL_DEBUG": "WARN"}},
            ),
        ],
    )
    doc["ranks"][1]["source"] = XSS_SCRIPT
    doc["ranks"][1]["host"] = XSS_IMG
    return as_report(doc, {r: make_timeline(seed=r, kernel_name=XSS_SCRIPT if r == 2 else None) for r in range(8)})


def test_report_page_in_chromium(driver, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    report = showcase_report()
    path = tmp_path / "report.html"
    path.write_text(render_html(report), encoding="utf-8")
    open_page(driver, path)

    assert driver.execute_script("return window.__dialogs") == []
    assert not driver.find_elements(By.TAG_NAME, "img")
    assert driver.find_element(By.CSS_SELECTOR, "#verdict h1").text == "Some communication is exposed"
    assert len(driver.find_elements(By.CSS_SELECTOR, "#oc-rank-table tbody tr")) == 8
    assert XSS_IMG in driver.find_element(By.ID, "oc-rank-table").text  # the host, as text
    assert len(driver.find_elements(By.CSS_SELECTOR, "article.finding")) == 2
    assert "rank 2 · step 10" in driver.find_element(By.ID, "oc-tl-info").text  # opens on the worst rank

    canvas = driver.find_element(By.ID, "oc-tl-canvas")
    painted = driver.execute_script(
        "var c = arguments[0], d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data, n = 0;"
        "for (var i = 0; i < d.length; i += 4) if (d[i] < 200 || d[i + 1] < 200) n++; return n;",
        canvas,
    )
    assert painted > 5000

    # hover the payload kernel (compute lane, event 5): the tooltip shows its name as text
    geometry = driver.execute_script(
        "var r = arguments[0].getBoundingClientRect(); return [r.width, r.height];", canvas
    )
    tl = report.timelines[2]
    ev = [e for e in tl.events if e[0] == 0][5]
    end = max(max(e[1] + e[2] for e in tl.events), max(iv[1] for iv in tl.exposed))
    x = 150 + (ev[1] + ev[2] / 2) / end * (geometry[0] - 150 - 6)
    y = 26 + 26 * 1.5  # axis, then the exposed row, then the compute lane
    ActionChains(driver).move_to_element_with_offset(
        canvas, int(x - geometry[0] / 2), int(y - geometry[1] / 2)
    ).perform()
    tip = driver.find_element(By.ID, "oc-tooltip")
    assert tip.is_displayed()
    assert tip.find_element(By.CSS_SELECTOR, ".tt-name").text == XSS_SCRIPT
    assert driver.execute_script("return arguments[0].querySelectorAll('script, img').length", tip) == 0
    driver.save_screenshot(str(_artifact("report-timeline-hover.png")))

    # wheel-zoom onto the exposed reduce-scatter at the end of the step
    exposed_x = 150 + (tl.exposed[0][0] + 300) / end * (geometry[0] - 150 - 6)
    for _ in range(8):
        driver.execute_script(
            "var c = arguments[0], r = c.getBoundingClientRect();"
            "c.dispatchEvent(new WheelEvent('wheel', {deltaY: -100, clientX: r.left + arguments[1],"
            " clientY: r.top + 40, bubbles: true, cancelable: true}));",
            canvas,
            exposed_x,
        )
    driver.find_element(By.ID, "timeline").screenshot(str(_artifact("report-timeline-zoomed.png")))

    # zoom, switch rank, sort, copy: all work without errors
    before = driver.find_element(By.ID, "oc-tl-info").text
    driver.find_element(By.ID, "oc-zoom-in").click()
    driver.execute_script(
        "var s = document.getElementById('oc-tl-rank'); s.value = '5';s.dispatchEvent(new Event('change'));"
    )
    assert driver.find_element(By.ID, "oc-tl-info").text != before
    overlap_th = [th for th in driver.find_elements(By.CSS_SELECTOR, "#oc-rank-table th") if th.text == "OVERLAP"]
    driver.execute_script("arguments[0].scrollIntoView({block: 'center', behavior: 'instant'})", overlap_th[0])
    overlap_th[0].click()
    first = driver.find_element(By.CSS_SELECTOR, "#oc-rank-table tbody tr td").text
    assert first == "2"  # ascending: the worst rank first
    copy = driver.find_element(By.CSS_SELECTOR, "#finding-0 button.copy")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center', behavior: 'instant'})", copy)
    copy.click()
    WebDriverWait(driver, 3).until(lambda d: copy.text in ("copied", "press Ctrl+C"))

    assert driver.execute_script("return window.__dialogs") == []
    assert console_errors(driver) == []
    _full_page_screenshot(driver, "report.png")


def test_64_rank_page_loads(driver, tmp_path):
    from selenium.webdriver.common.by import By

    report = make_report(
        64,
        overlaps=[0.6 + 0.004 * r for r in range(64)],
        timelines={r: make_timeline(seed=r, n_compute=4_000, n_comm=200) for r in range(64)},
    )
    path = tmp_path / "report64.html"
    path.write_text(render_html(report), encoding="utf-8")
    open_page(driver, path)
    load_ms = driver.execute_script(
        "var t = performance.getEntriesByType('navigation')[0]; return t.loadEventEnd - t.startTime;"
    )
    assert len(driver.find_elements(By.CSS_SELECTOR, "#oc-rank-table tbody tr")) == 64
    assert "rank 0" in driver.find_element(By.ID, "oc-tl-info").text
    assert console_errors(driver) == []
    assert load_ms < 10_000, load_ms
    _artifact("report64-load.json").write_text(json.dumps({"load_ms": load_ms, "bytes": path.stat().st_size}))
    _full_page_screenshot(driver, "report64.png")


@pytest.mark.skipif(DLRM is None or not DLRM.is_dir(), reason="needs the real DLRM traces")
def test_real_dlrm_report_in_chromium(driver, tmp_path):
    from click.testing import CliRunner
    from selenium.webdriver.common.by import By

    from overlapcheck.cli import main

    html = tmp_path / "dlrm.html"
    result = CliRunner().invoke(
        main,
        [
            "analyze",
            str(DLRM),
            "--format",
            "json",
            "-o",
            str(tmp_path / "dlrm.json"),
            "--html",
            str(html),
        ],
    )
    assert result.exit_code == 0, result.output
    open_page(driver, html)
    assert len(driver.find_elements(By.CSS_SELECTOR, "#oc-rank-table tbody tr")) == 8
    assert "step" in driver.find_element(By.ID, "oc-tl-info").text
    assert driver.execute_script("return window.__dialogs") == []
    assert console_errors(driver) == []
    _full_page_screenshot(driver, "report-dlrm-8rank.png")


def test_trap_catches_unescaped_markup(driver, tmp_path):
    """Control: the same checks do fire on a page that does not escape, so a pass above means something."""
    path = tmp_path / "unsafe.html"
    path.write_text(f"<!DOCTYPE html><html><body><p>{XSS_IMG}</p></body></html>", encoding="utf-8")
    open_page(driver, path)
    driver.execute_script("return 1")
    assert driver.execute_script("return window.__dialogs") == ["alert:1"]


def _artifact(name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS / name


def _full_page_screenshot(driver, name: str) -> None:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(height + 120, 12_000))
    driver.execute_script("window.scrollTo({top: 0, behavior: 'instant'})")
    driver.save_screenshot(str(_artifact(name)))
    driver.set_window_size(1400, 1000)


def test_rank_and_step_pickers_and_host_lane(driver, tmp_path):
    """A real analysis (timelines of every step): pick a rank and a step, hover a blamed host event, click it to
    open its finding; hover a collective for its stream and size."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    import overlapcheck

    samples = Path(__file__).resolve().parent.parent / "sample_traces" / "seed-5201"
    report = overlapcheck.analyze(samples, timelines=True, jobs=1, ranks=[0, 1, 2, 3])
    path = tmp_path / "pickers.html"
    path.write_text(HtmlRenderer(perfetto="trace.json.gz").render(report), encoding="utf-8")
    open_page(driver, path)

    step_options = driver.execute_script(
        "return Array.prototype.map.call(document.querySelectorAll('#oc-tl-step option'), function (o) {"
        " return o.value; });"
    )
    assert step_options == ["5", "6"]
    driver.execute_script(
        "var s = document.getElementById('oc-tl-rank'); s.value = '1'; s.dispatchEvent(new Event('change'));"
    )
    driver.execute_script(
        "var s = document.getElementById('oc-tl-step'); s.value = '6'; s.dispatchEvent(new Event('change'));"
    )
    assert driver.find_element(By.ID, "oc-tl-info").text.startswith("rank 1 · step 6")

    canvas = driver.find_element(By.ID, "oc-tl-canvas")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center', behavior: 'instant'})", canvas)
    width, height = driver.execute_script(
        "var r = arguments[0].getBoundingClientRect(); return [r.width, r.height];", canvas
    )
    data = json.loads(
        driver.execute_script("return document.querySelector('script.oc-timeline[data-rank=\"1\"]').textContent")
    )
    step = next(s for s in data["steps"] if s["step"] == 6)
    pad = (step["end"] - step["start"]) * 0.01
    v0, v1 = step["start"] - pad, step["end"] + pad

    def point(t: float, row: int) -> tuple[int, int]:
        x = 150 + (t - v0) / (v1 - v0) * (width - 150 - 6)
        return int(x - width / 2), int(26 + 26 * row + 13 - height / 2)

    def hover(t: float, row: int, want: str = ""):
        tip = driver.find_element(By.ID, "oc-tooltip")
        # a scroll that lands after the move (hash navigation, scrollIntoView; late on a loaded machine) hides the
        # tip or moves another row under the cursor: scroll back and move again until the tip is the one wanted
        for _ in range(8):
            ActionChains(driver).move_to_element_with_offset(canvas, *point(t, row)).perform()
            if tip.get_attribute("hidden") is None and want in tip.get_attribute("textContent"):
                break
            driver.execute_script("arguments[0].scrollIntoView({block: 'center', behavior: 'instant'})", canvas)
            ActionChains(driver).move_to_element_with_offset(canvas, 0, 0).pause(0.3).perform()
        assert tip.get_attribute("hidden") is None
        return tip.get_attribute("textContent")  # the tooltip may sit below the canvas's visible box

    # the host lane (under the GPU lanes): the longest blamed event of the step
    host = data["host"]
    k = max(
        (i for i in range(len(host["s"])) if step["start"] <= host["s"][i] < step["end"]), key=lambda i: host["d"][i]
    )
    # the tooltip names the shortest blamed event within a few pixels of the cursor: that one is expected
    margin = 2 * (v1 - v0) / (width - 156)
    mid = host["s"][k] + host["d"][k] / 2
    near = [j for j in range(len(host["s"])) if host["s"][j] - margin <= mid <= host["s"][j] + host["d"][j] + margin]
    k = min(near, key=lambda j: host["d"][j])
    text = hover(mid, len(data["lanes"]) + 1, want="finding ")
    assert f"finding {host['f'][k] + 1}: " in text and host["title"][k] in text
    driver.find_element(By.ID, "timeline").screenshot(str(_artifact("report-timeline-host-lane.png")))
    ActionChains(driver).move_to_element_with_offset(canvas, *point(mid, len(data["lanes"]) + 1)).click().perform()
    assert driver.execute_script("return location.hash") == f"#finding-{host['f'][k]}"

    # a collective: duration, start, stream and size in the tooltip
    driver.execute_script("arguments[0].scrollIntoView({block: 'center', behavior: 'instant'})", canvas)
    sized = [
        (lane["d"][i], n, i)
        for n, lane in enumerate(data["lanes"])
        for i in range(len(lane["s"]))
        if step["start"] <= lane["s"][i] < step["end"] and (lane["b"][i] >= 0 or lane["e"][i] >= 0)
    ]
    _, lane_no, j = max(sized)
    lane = data["lanes"][lane_no]
    text = hover(lane["s"][j] + lane["d"][j] / 2, lane_no + 1, want=f"stream {lane['stream']}")
    assert f"stream {lane['stream']}" in text and "duration" in text and "into step 6" in text
    assert "size " in text
    # each finding links to the Perfetto file written beside the page
    links = driver.find_elements(By.CSS_SELECTOR, "article.finding a.perfetto")
    assert links and all(a.get_attribute("href").endswith("/trace.json.gz") for a in links)
    assert driver.execute_script("return window.__dialogs") == []
    assert console_errors(driver) == []
    _full_page_screenshot(driver, "report-pickers.png")
