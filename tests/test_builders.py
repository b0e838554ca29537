"""The hand-built reports of builders.py follow the schema (docs/report-schema.md), so that the renderer and
gate tests run against the real contract; its shared simulated sets are simulated once each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from builders import KINDS, SimulatedSets, make_finding, report_doc

import overlapcheck.simulate
from overlapcheck.model import COLLECTIVE_KEYS, Report


def test_fixture_follows_schema():
    """The fixture report has every key docs/report-schema.md lists, and reads back as the same document."""
    report = report_doc(3)
    assert set(report) >= {"schema", "tool", "run", "ranks", "summary", "findings", "findings_explain_share", "errors"}
    rank = report["ranks"][0]
    assert set(rank) >= {
        "rank",
        "source",
        "world_size",
        "backend",
        "host",
        "lanes",
        "span_us",
        "busy_us",
        "compute_us",
        "idle_us",
        "step_time_us",
        "exposed_share",
        "collectives",
        "memcpy",
        "memset",
        "streams",
        "steps",
        "notes",
    }
    assert set(rank["collectives"]) == set(KINDS) == set(COLLECTIVE_KEYS)
    assert set(rank["steps"][0]) >= {
        "step",
        "start_us",
        "duration_us",
        "cpu_duration_us",
        "compute_us",
        "exposed_share",
        "collectives",
        "memcpy",
        "memset",
    }
    all_split = rank["collectives"]["all"]
    assert abs(all_split["time_us"] - all_split["overlapped_us"] - all_split["exposed_us"]) < 1e-6
    assert report["summary"]["metrics"]["all.overlap"]["worst_rank"] == 2
    # the typed model validates every field and writes the very same document back
    assert Report.from_dict(report).to_dict() == report


def test_fixture_finding_round_trips():
    doc = report_doc(2, findings=[make_finding(), make_finding(rule="straggler", fix={"env": {"NCCL_DEBUG": "WARN"}})])
    report = Report.from_dict(doc)
    assert report.findings[0].fix.env == {"CUDA_DEVICE_MAX_CONNECTIONS": None, "NCCL_ALGO": "Ring"}
    assert report.findings[1].fix.config is None and report.findings[1].fix.upgrade is None
    assert report.to_dict() == doc


def test_simulated_sets_are_generated_once_per_scenario_and_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []

    def generate(scenario: str, out: Path, **options: object) -> dict:
        calls.append((scenario, options))
        out.mkdir()
        (out / "truth.json").write_text(json.dumps({"scenario": scenario, "n": len(calls)}))
        return {}

    monkeypatch.setattr(overlapcheck.simulate, "generate", generate)
    sets = SimulatedSets(tmp_path / "sets")
    a, truth = sets.get("straggler", nodes=2, gpus_per_node=1)
    assert truth == {"scenario": "straggler", "n": 1}
    assert sets.get("straggler", gpus_per_node=1, nodes=2) == (a, truth)  # the options' order does not matter
    b = sets.folder("straggler", nodes=2, gpus_per_node=2)
    assert b != a and calls == [
        ("straggler", {"nodes": 2, "gpus_per_node": 1}),
        ("straggler", {"nodes": 2, "gpus_per_node": 2}),
    ]
    assert not list((tmp_path / "sets").glob("*.partial"))  # written beside, then renamed into place
