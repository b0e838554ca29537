"""On every real trace (../shared/traces, and the real gloo capture in tests/data): each rank's exposed
communication per step splits into explained, inherent and unexplained windows that do not overlap and sum to it
(docs/metrics.md, Accounting), and the unexplained part is reported, located, whenever it reaches its threshold."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import shared_traces_dir

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.metrics import analyze_model
from overlapcheck.diagnose import _diagnose
from overlapcheck.diagnose.facts.coverage import coverage, exposed_windows
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.registry import LIMITS
from overlapcheck.diagnose.rules.exposure import UNEXPLAINED
from overlapcheck.trace.reader import load_trace

SHARED = shared_traces_dir()
GLOO = Path(__file__).parent / "data" / "gloo-2rank"
FILES = sorted(p for p in (SHARED.rglob("*.json*") if SHARED else []) if p.is_file()) + sorted(GLOO.glob("*.json.gz"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_exposed_time_is_explained_inherent_or_unexplained(path: Path) -> None:
    model = load_trace(str(path))
    facts = RankFacts(model, analyze_model(model))
    findings, _ = _diagnose(facts)
    # the split the residual rule saw: every finding but its own
    cov = coverage(facts, [f for f in findings if f.rule != UNEXPLAINED.id], LIMITS)
    exposed = exposed_windows(facts)
    explained = iv.subtract(iv.subtract(exposed, cov.unexplained), iv.intersect(exposed, cov.inherent))
    n = facts.n_steps
    # the three parts are disjoint windows of E and cover it
    assert iv.length(iv.intersect(cov.unexplained, cov.inherent)) == pytest.approx(0.0, abs=1e-6)
    assert iv.length(iv.subtract(cov.unexplained, exposed)) == pytest.approx(0.0, abs=1e-6)
    total = cov.explained_us + cov.inherent_us + cov.unexplained_us
    assert total == pytest.approx(cov.exposed_us, rel=1e-9, abs=1e-6)
    assert iv.length(exposed) / n == pytest.approx(cov.exposed_us)
    assert iv.length(explained) / n <= cov.explained_us + cov.inherent_us + 1e-6
    # what no finding explains is reported, with its locations, from its threshold on
    rest = [f for f in findings if f.rule == UNEXPLAINED.id]
    if cov.unexplained_us >= UNEXPLAINED.min_share * facts.step_time_us and cov.unexplained_us > 0:
        (f,) = rest
        assert f.cost_us == pytest.approx(cov.unexplained_us, abs=1e-3)
        located = sum(loc["exposed_us_per_step"] for loc in f.evidence["by_location"])
        assert located == pytest.approx(cov.unexplained_us, rel=1e-3) or len(f.evidence["by_location"]) == 5
    else:
        assert not rest


def test_the_real_traces_are_there() -> None:
    if SHARED is None:
        pytest.skip("../shared/traces not present")
    assert len(FILES) >= 10
