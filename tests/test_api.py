"""The Python API (docs/api.md) and the typed report model: to_dict is the CLI's document, from_dict reads it
back and rejects documents of the wrong shape with one line naming the field."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import overlapcheck
from overlapcheck.cli import main
from overlapcheck.errors import UserError
from overlapcheck.model import COLLECTIVE_KEYS, Report, ReportFormatError
from overlapcheck.report.json import JsonRenderer

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"


@pytest.fixture(scope="module")
def straggler() -> Report:
    return overlapcheck.analyze(SAMPLES / "straggler")


def test_analyze_equals_the_cli_document(straggler: Report, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["analyze", str(SAMPLES / "straggler"), "--format", "json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    cli = json.loads(out.read_text())
    api = json.loads(JsonRenderer().render(straggler))
    for r in cli["ranks"] + api["ranks"]:
        r.pop("source")  # the CLI was given a path string, the API a Path: the same file
    assert api == cli
    assert straggler.findings and straggler.findings[0].rule == "straggler"


def test_round_trip_through_json(straggler: Report) -> None:
    doc = json.loads(JsonRenderer(digits=None).render(straggler))
    again = Report.from_dict(doc)
    assert again.to_dict() == straggler.to_dict()
    assert again == Report.from_dict(again.to_dict())


def test_ds_config_as_dict_or_file(tmp_path: Path) -> None:
    config = json.loads((SAMPLES / "bucket-too-large" / "ds_config.json").read_text())
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    traces = sorted((SAMPLES / "bucket-too-large").glob("rank*.trace.json.gz"))
    by_dict = overlapcheck.analyze(traces, ds_config=config)
    by_file = overlapcheck.analyze(traces, ds_config=path)
    assert by_dict.to_dict() == by_file.to_dict()
    with pytest.raises(overlapcheck.UserError, match="no such file"):
        overlapcheck.analyze(traces, ds_config=tmp_path / "missing.json")


@pytest.mark.parametrize(
    ("level", "rows", "columns"),
    [
        ("ranks", 2, {"rank", "overlap", "exposed_share", "comm_exposed_us", "host"}),
        ("collectives", None, {"rank", "collective", "overlap", "exposed_us"}),
        ("steps", 4, {"rank", "step", "duration_us", "overlap", "exposed_share"}),
        ("phases", None, {"rank", "step", "phase", "collective", "compute_us"}),
        ("modules", None, {"module", "class", "collective", "phase", "source", "exposed_us", "hidden_us"}),
        ("findings", None, {"rule", "severity", "cost_us", "fix_config"}),
    ],
)
def test_dataframes(straggler: Report, level: str, rows: int | None, columns: set[str]) -> None:
    df = straggler.dataframe(level)
    assert columns <= set(df.columns)
    if rows is not None:
        assert len(df) == rows
    if level == "ranks":
        assert list(df["overlap"]) == [r.overlap() for r in straggler.ranks]
    if level == "collectives":
        all_rows = df[df.collective == "all"]
        assert list(all_rows["exposed_us"]) == [r.collectives["all"].exposed_us for r in straggler.ranks]
    if level == "findings":
        assert list(df["rule"]) == [f.rule for f in straggler.findings]
    if level == "modules":  # the simulated traces have no python frames: every row without a module, all the time
        assert straggler.modules is not None and len(df) == len(straggler.modules.rows)
        assert df["module"].isna().all()
        assert df["time_us"].sum() == pytest.approx(sum(r.time_us for r in straggler.modules.rows))
    with pytest.raises(UserError, match="unknown level"):
        straggler.dataframe("kernels")


def _doc(report: Report) -> dict:
    return json.loads(JsonRenderer().render(report))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(schema="overlapcheck.report/2"), "not supported"),
        (lambda d: d.update(schema="something/1"), "not an overlapcheck report"),
        (lambda d: d.update(ranks={}), "ranks is not a list"),
        (lambda d: d["ranks"][0].update(rank="0"), r"ranks\[0\].rank is not an integer"),
        (lambda d: d["ranks"][0].pop("collectives"), r"ranks\[0\].collectives is missing"),
        (lambda d: d["ranks"][0]["collectives"].pop("all_gather"), "has no 'all_gather'"),
        (lambda d: d["ranks"][1]["collectives"]["all"].update(count=1.5), r"ranks\[1\].collectives.all.count"),
        (lambda d: d["ranks"][0]["steps"][1].update(duration_us="long"), r"steps\[1\].duration_us"),
        (lambda d: d["findings"][0].update(severity=None), r"findings\[0\].severity is not a string"),
        (lambda d: d["findings"][0].update(fix=[]), r"findings\[0\].fix is not an object"),
        (lambda d: d["summary"]["metrics"]["all.overlap"].update(median=True), "median is not a finite number"),
        (lambda d: d.update(errors=[{"source": 1, "error": "x"}]), r"errors\[0\].source is not a string"),
    ],
)
def test_from_dict_names_the_wrong_field(straggler: Report, edit, message: str) -> None:
    doc = copy.deepcopy(_doc(straggler))
    edit(doc)
    with pytest.raises(ReportFormatError, match=message) as info:
        Report.from_dict(doc, "r.json")
    assert "\n" not in str(info.value) and str(info.value).startswith("r.json: ")


def test_from_dict_ignores_unknown_keys_and_accepts_minimal_optional_parts(straggler: Report) -> None:
    doc = _doc(straggler)
    doc["added_in_1_x"] = {"anything": [1]}
    doc["ranks"][0]["new_metric"] = 3
    for step in doc["ranks"][0]["steps"]:
        del step["phases"]  # older documents had no phases
    report = Report.from_dict(doc)
    assert report.ranks[0].steps[0].phases == {}
    assert set(report.ranks[0].collectives) == set(COLLECTIVE_KEYS)


def test_gate_reads_through_the_model(straggler: Report, tmp_path: Path) -> None:
    doc = _doc(straggler)
    doc["ranks"][0]["collectives"]["all"]["overlap"] = "high"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    result = CliRunner().invoke(main, ["gate", str(path), "--min-overlap", "all=0.5"])
    assert result.exit_code == 2
    assert "collectives.all.overlap is not a finite number" in result.output
    assert "Traceback" not in result.output
