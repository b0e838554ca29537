"""A flat cost per rank in the main process (docs/scale.md): the JSON report written as a stream is the text of
the whole document, a streamed file is written atomically, and the compact per-rank storage changes no value."""

from __future__ import annotations

import copy
import dataclasses
import errno
import json
import os
from pathlib import Path

import pytest
from builders import ROOT, run_cli

import overlapcheck
from overlapcheck import fsutil
from overlapcheck.compact import Compactor
from overlapcheck.errors import UserError
from overlapcheck.model import Report
from overlapcheck.report.json import JsonRenderer, document_json

SAMPLES = ROOT / "sample_traces"


@pytest.fixture(scope="module")
def reports() -> list[Report]:
    return [overlapcheck.analyze(SAMPLES / name, jobs=1) for name in ("straggler", "offload-sync", "clock-skew")]


def test_the_stream_is_the_document_byte_for_byte(reports: list[Report]) -> None:
    for report in [*reports, dataclasses.replace(reports[0], ranks=[], findings=[], bandwidth=None)]:
        for digits in (6, None):
            pieces = list(JsonRenderer(digits).stream(report))
            assert "".join(pieces) == document_json(report.to_dict(), digits)
            assert len(pieces) >= len(report.ranks)  # one piece (at least) per rank, never the whole list at once
        assert (
            json.loads(JsonRenderer().render(report))["ranks"] == json.loads(document_json(report.to_dict()))["ranks"]
        )


def test_the_cli_streams_to_a_file_and_to_stdout(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert run_cli("analyze", str(SAMPLES / "straggler"), "--format", "json", "-o", str(out)).returncode == 0
    printed = run_cli("analyze", str(SAMPLES / "straggler"), "--format", "json")
    expected = document_json(overlapcheck.analyze(str(SAMPLES / "straggler")).to_dict())
    assert out.read_text() == printed.stdout == expected


def test_atomic_write_of_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.json"
    fsutil.atomic_write(target, iter(["{", '"a": ', "1", "}\n"]))
    assert target.read_text() == '{"a": 1}\n'
    with pytest.raises(UserError, match="already exists"):
        fsutil.atomic_write(target, iter(["x"]))

    def broken() -> object:  # a renderer that fails half-way leaves the old file and no temp file
        yield "half"
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):
        fsutil.atomic_write(target, broken(), force=True)  # type: ignore[arg-type]
    assert target.read_text() == '{"a": 1}\n' and os.listdir(tmp_path) == ["out.json"]

    def no_link(src: str, dst: str) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_link)  # the exclusive-create fallback copies the streamed temp file
    fsutil.atomic_write(tmp_path / "b.json", iter(["x" * 3_000_000, "y"]))
    assert (tmp_path / "b.json").read_text() == "x" * 3_000_000 + "y"


def test_compact_ranks_share_their_empty_parts_and_keep_every_value(reports: list[Report]) -> None:
    from overlapcheck.model import RankResult, _to_plain
    from overlapcheck.packed import PackedList

    report = reports[0]
    before = [json.dumps(_to_plain(r)) for r in report.ranks]
    copies = [RankResult(copy.deepcopy(r)) for r in report.ranks]  # as they arrive: the process's own objects
    compactor = Compactor()
    out = [compactor.result(c).metrics for c in copies]
    assert [json.dumps(_to_plain(m)) for m in out] == before
    assert all(isinstance(m.steps, PackedList) for m in out)  # the steps as columns (tests/test_packed.py)
    empty = [s for m in out for s in m.collectives.values() if s.count == 0]
    empty += [c for m in out for c in (m.memcpy, m.memset) if c.count == 0]
    assert len(empty) > 2 * len({repr(e) for e in empty})
    assert len({id(e) for e in empty}) == len({repr(e) for e in empty})  # one object per distinct empty value


def test_html_shows_the_worst_ranks_past_the_limit() -> None:
    from builders import make_report

    from overlapcheck.report import html

    n = html.MAX_RANKS_SHOWN + 40
    overlaps = [0.9 - 0.8 * ((i * 37) % n) / n for i in range(n)]
    report = make_report(n, overlaps=overlaps)
    view = html.build_view(report)
    shown = view["ranks"]
    assert len(shown) == html.MAX_RANKS_SHOWN and view["n_ranks"] == n
    worst = sorted(range(n), key=lambda i: overlaps[i])[: html.MAX_RANKS_SHOWN]
    assert [row["rank"] for row in shown] == worst and shown[0]["worst"]
    columns = view["crossrank"]["columns"]
    assert [c["rank"] for c in columns] == sorted(worst)  # the per-rank chart: the same ranks, in rank order
    page = html.HtmlRenderer().render(report)
    assert f"the {html.MAX_RANKS_SHOWN} with the lowest overlap of {n}" in page
    small = make_report(8)
    assert len(html.build_view(small)["ranks"]) == 8 and "with the lowest overlap of" not in html.HtmlRenderer().render(
        small
    )


def test_compact_ranks_share_their_collective_keys() -> None:
    import pickle

    from overlapcheck import pipeline

    inputs = pipeline.find_inputs([str(SAMPLES / "straggler")])
    job, options = pipeline.job_context(inputs), pipeline.Options()
    blobs = [pickle.dumps(pipeline._worker(p, job, options)[1][0]) for p in inputs.traces[:2]]
    arrived = [pickle.loads(b) for b in blobs * 2]  # each its own strings, as unpickled results are
    before = [list(r.signature.keys) for r in arrived]
    compactor = Compactor()
    out = [compactor.result(r).signature for r in arrived]
    assert [s.keys for s in out] == before and len(before[0]) > 10
    assert len({id(k) for s in out for k in s.keys}) == len({k for s in out for k in s.keys})
