"""`--perfetto`, `--steps` and `--ranks` (issue 14, parts 3 and 4): the Chrome-trace file parses, has every
rank, its exposed intervals add up to the report's exposed time per rank, ranks' clocks are aligned on a shared
collective; the filters bound what is analyzed and say so; the timelines carry every selected step, the phases
and the host events the findings blame."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import overlapcheck
from overlapcheck.cli import main
from overlapcheck.commands.analyze import parse_numbers
from overlapcheck.report.perfetto import EXPOSED_TID, PerfettoRenderer, clock_shifts

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"


def _events(doc: dict) -> list[dict]:
    return [e for e in doc["traceEvents"] if e["ph"] == "X"]


@pytest.fixture(scope="module")
def seed_report():
    return overlapcheck.analyze(SAMPLES / "seed-5201", timelines=True, jobs=1)


def test_timeline_exposed_intervals_equal_the_metric_on_every_sample_set():
    for folder in sorted(p for p in SAMPLES.iterdir() if p.is_dir()):
        report = overlapcheck.analyze(folder, timelines=True, jobs=1)
        assert set(report.timelines) == {r.rank for r in report.ranks}, folder.name
        for r in report.ranks:
            tl = report.timelines[r.rank]
            total = sum(b - a for a, b in tl.exposed)
            assert total == pytest.approx(r.collectives["all"].exposed_us, rel=1e-9, abs=1e-6), (folder.name, r.rank)
            assert [s.step for s in tl.steps] == [s.step for s in r.steps]


def test_perfetto_file_parses_has_every_rank_and_exposed_adds_up(seed_report, tmp_path):
    report = seed_report
    out = tmp_path / "t.json.gz"
    result = CliRunner().invoke(
        main,
        [
            "analyze",
            str(SAMPLES / "seed-5201"),
            "--format",
            "json",
            "-o",
            str(tmp_path / "r.json"),
            "--perfetto",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(gzip.decompress(out.read_bytes()))
    assert doc["displayTimeUnit"] == "ms"
    names = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(names.values()) == sorted(f"rank {r.rank} ({r.host})" for r in report.ranks)
    exposed: dict[int, float] = defaultdict(float)
    for e in _events(doc):
        if e["tid"] == EXPOSED_TID:
            exposed[e["pid"]] += e["dur"]
    json_doc = json.loads((tmp_path / "r.json").read_text())
    for r in json_doc["ranks"]:
        assert exposed[r["rank"] + 1] == pytest.approx(r["collectives"]["all"]["exposed_us"], abs=0.01), r["rank"]
    # stream lanes keep the original stream numbers; collectives carry their size
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    for e in _events(doc):
        if e["cat"].startswith("comm:") or e["cat"] == "compute":
            assert threads[(e["pid"], e["tid"])] == f"stream {e['tid']}" == f"stream {e['args']['stream']}"
    assert any("bytes" in e.get("args", {}) or "nelems" in e.get("args", {}) for e in _events(doc))
    # findings: slices on the steps where they occur, with title, cost and fix
    found = [e for e in _events(doc) if e["cat"].startswith("finding:")]
    assert {e["args"]["title"] for e in found} == {f.title for f in report.findings}
    top = next(e for e in found if e["args"]["finding_index"] == 0)
    assert top["args"]["cost_us"] == report.findings[0].cost_us
    assert "reduce_bucket_size" in top["args"]["fix"]
    # the blamed host events point at their findings
    blamed = [e for e in _events(doc) if e["cat"].startswith("blame:")]
    assert {e["cat"] for e in blamed} >= {"blame:sync", "blame:wait"}
    assert all(
        report.findings[e["args"]["finding_index"]].rule == e["args"]["rule"] for e in blamed if "finding" in e["args"]
    )
    # the plain .json form is the same document
    plain = PerfettoRenderer.for_path("x.json").render(report)
    assert isinstance(plain, str) and json.loads(plain)["metadata"]["ranks"] == [r.rank for r in report.ranks]


def test_clocks_are_aligned_on_a_shared_collective():
    report = overlapcheck.analyze(SAMPLES / "clock-skew", timelines=True, jobs=1)
    shifts, how = clock_shifts(report.timelines)
    assert "aligned on the end of collective" in how
    assert abs(shifts[1]) > 100  # the planted skew between the two nodes
    ends = [dict(reversed(report.timelines[r].anchors)) for r in (0, 1)]
    shared = [k for k in ends[0] if k in ends[1]]
    assert len(shared) > 10
    # after the shift every shared collective ends together on both ranks (they end together in reality)
    worst = max(abs(ends[0][k] - (ends[1][k] + shifts[1])) for k in shared)
    assert worst < 50.0, worst
    # without a shared collective: no shift, and the file says so
    from dataclasses import replace

    lonely = {r: replace(tl, anchors=[(f"x|{r}", 1.0)]) for r, tl in report.timelines.items()}
    shifts, how = clock_shifts(lonely)
    assert set(shifts.values()) == {0.0} and how.startswith("not aligned")


def test_findings_blame_host_events_linked_to_findings(seed_report):
    report = seed_report
    tl = report.timelines[0]
    kinds = {b.kind for b in tl.host}
    assert {"sync", "wait"} <= kinds
    for b in tl.host:
        assert 0 <= b.finding < len(report.findings)
        assert report.findings[b.finding].rule == b.rule
        assert b.end >= b.start
    timer = [b for b in tl.host if b.rule == "throughput-timer-sync" and b.kind == "sync"]
    assert timer and all(b.call == "cudaDeviceSynchronize" for b in timer)
    step = tl.steps[0]
    assert set(step.phases) == {"forward", "backward", "optimizer"}
    assert step.phases["forward"][0] <= step.phases["backward"][0] <= step.phases["optimizer"][0]


def test_steps_filter_restricts_the_analysis_and_says_so(tmp_path):
    full = overlapcheck.analyze(SAMPLES / "seed-5201", jobs=1)
    one = overlapcheck.analyze(SAMPLES / "seed-5201", jobs=1, steps=[6])
    for a, b in zip(full.ranks, one.ranks, strict=True):
        assert [s.step for s in b.steps] == [6]
        assert b.steps[0] == next(s for s in a.steps if s.step == 6) or b.steps[0].step == 6
        assert b.collectives["all"].time_us < a.collectives["all"].time_us
        assert any("restricted to steps 6 (--steps)" in n for n in b.notes)
        assert not any("--steps" in n for n in a.notes)
    # per-step numbers of a step stay those of the full analysis (the step's own work)
    a6 = next(s for s in full.ranks[0].steps if s.step == 6)
    b6 = one.ranks[0].steps[0]
    assert b6.collectives["all"].time_us == pytest.approx(a6.collectives["all"].time_us)
    with pytest.raises(overlapcheck.UserError, match="selects no step of any rank: the traces hold steps 5-6"):
        overlapcheck.analyze(SAMPLES / "seed-5201", jobs=1, steps=[99])  # a selection that matches nothing


def test_ranks_filter_reads_only_those_files(tmp_path):
    report = overlapcheck.analyze(SAMPLES / "seed-5201", jobs=1, ranks=[0, 1, 2, 3, 8])
    assert [r.rank for r in report.ranks] == [0, 1, 2, 3, 8]
    result = CliRunner().invoke(
        main,
        [
            "analyze",
            str(SAMPLES / "seed-5201"),
            "--ranks",
            "0-1",
            "--steps",
            "5:5",
            "--format",
            "json",
            "-o",
            str(tmp_path / "r.json"),
            "--perfetto",
            str(tmp_path / "p.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["metadata"]["ranks"] == [0, 1]
    assert {e.get("args", {}).get("step") for e in _events(doc) if e["cat"] == "compute"} == {5}
    assert [r["rank"] for r in json.loads((tmp_path / "r.json").read_text())["ranks"]] == [0, 1]


def test_parse_numbers():
    assert parse_numbers("5:7", ":", "--steps") == {5, 6, 7}
    assert parse_numbers("5,6", ":", "--steps") == {5, 6}
    assert parse_numbers("0-3,8", "-", "--ranks") == {0, 1, 2, 3, 8}
    assert parse_numbers(None, "-", "--ranks") is None
    for bad in ("x", "3-1", "-1", "1:2:3"):
        with pytest.raises(click.BadParameter):
            parse_numbers(bad, "-", "--ranks")


def test_json_report_unchanged_by_timelines_and_perfetto(tmp_path):
    plain = overlapcheck.analyze(SAMPLES / "straggler", jobs=1).to_dict()
    with_tl = overlapcheck.analyze(SAMPLES / "straggler", jobs=1, timelines=True).to_dict()
    assert plain == with_tl


def test_report_run_dir_with_perfetto_reads_the_traces(tmp_path):
    src = SAMPLES / "straggler"
    run = tmp_path / "run"
    run.mkdir()
    for trace in sorted(src.glob("rank*.trace.json.gz")):
        rank = trace.name.split(".")[0]
        (run / trace.name).write_bytes(trace.read_bytes())
        subprocess.run(
            [
                sys.executable,
                "-m",
                "overlapcheck.capture.summary",
                "--trace",
                str(run / trace.name),
                "--out",
                str(run / f"{rank}.summary.json"),
                "--status",
                str(tmp_path / f"{rank}.status.json"),
            ],
            check=True,
            cwd=ROOT,
        )
    out = tmp_path / "p.json"
    html = tmp_path / "r.html"
    result = CliRunner().invoke(
        main,
        [
            "report",
            str(run),
            "--format",
            "json",
            "-o",
            str(tmp_path / "r.json"),
            "--perfetto",
            str(out),
            "--html",
            str(html),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "reading the ranks' traces" in result.output
    doc = json.loads(out.read_text())
    assert doc["metadata"]["ranks"] == [0, 1] and doc["metadata"]["ranks_without_events"] == []
    page = html.read_text()
    assert 'href="p.json"' in page and "ui.perfetto.dev" in page


def test_findings_are_drawn_on_the_windows_they_blame_not_on_whole_steps(seed_report):
    """A finding that blames events on a rank is drawn there (its overlapping events merged), not as a slice the
    length of each step it occurs in; one that blames none falls back to its steps, and says which it is."""
    from overlapcheck.report.perfetto import finding_windows, trace_document

    doc = trace_document(seed_report)
    shifts = doc["metadata"]["clock_shift_us"]
    origin = doc["metadata"]["time_origin_us"]
    drawn = 0
    for rank, tl in seed_report.timelines.items():
        steps = {(round(s.start, 3), round(s.end, 3)) for s in tl.steps}
        mine = [e for e in _events(doc) if e["pid"] == rank + 1 and e["cat"].startswith("finding:")]
        for i, f in enumerate(seed_report.findings):
            blamed = sorted((b.start, b.end) for b in tl.host if b.finding == i)
            slices = sorted((e["ts"], e["dur"]) for e in mine if e["args"]["finding_index"] == i)
            if not blamed:
                continue
            drawn += 1
            windows, how = finding_windows(i, f, tl)
            assert how.startswith(f"the {len(blamed)} events it blames")
            assert {(round(a, 3), round(b, 3)) for a, b in windows}.isdisjoint(steps)
            # every blamed event lies inside one slice, and the slices cover nothing else
            shift = shifts[str(rank)] - origin
            for a, b in blamed:
                assert any(ts - 0.01 <= a + shift and a + shift + (b - a) <= ts + dur + 0.01 for ts, dur in slices)
            assert sum(d for _, d in slices) <= sum(b - a for a, b in blamed) + 0.01 * len(blamed)
            assert all(e["args"]["drawn_on"] == how for e in mine if e["args"]["finding_index"] == i)
    assert drawn >= 5


def test_a_finding_that_blames_nothing_is_drawn_on_its_steps(seed_report):
    from dataclasses import replace

    from overlapcheck.report.perfetto import finding_windows

    tl = replace(seed_report.timelines[0], host=[])
    f = seed_report.findings[0]
    windows, how = finding_windows(0, f, tl)
    assert windows == [(s.start, s.end) for s in tl.steps if s.step in f.steps] and how.startswith("each step")


def test_a_report_without_timelines_is_an_error_not_an_empty_trace() -> None:
    """The API's `renderer("perfetto")` over a report analyzed without timelines: an empty trace would read as a
    job with no events."""
    from builders import make_report

    from overlapcheck.errors import UserError

    report = make_report()
    assert report.ranks and not report.timelines
    with pytest.raises(UserError, match="no timelines"):
        PerfettoRenderer().render(report)
