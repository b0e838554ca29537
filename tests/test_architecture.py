"""The layering of docs/architecture.md, checked on the imports of every module (module level and inside
functions): data flows one way, trace -> analysis -> diagnose -> report, orchestrated from the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "overlapcheck"

# package part -> parts of overlapcheck it must never import
FORBIDDEN = {
    "model": {"trace", "analysis", "diagnose", "report", "pipeline", "capture", "commands", "simulate"},
    "job": {"trace", "analysis", "diagnose", "report", "pipeline", "capture", "commands", "simulate"},
    "errors": {"trace", "analysis", "diagnose", "report", "pipeline", "capture", "commands", "simulate", "model"},
    "trace": {"analysis", "diagnose", "report", "pipeline", "commands"},
    "analysis": {"diagnose", "report", "pipeline", "commands"},
    "diagnose": {"report", "pipeline", "commands"},
    "report": {"pipeline", "capture", "diagnose", "analysis", "trace"},
    "diagnose/facts": {"diagnose/rules"},
    # the comparison and the gate's checks are stages over Reports; renderers (report/) render them
    "compare": {"trace", "analysis", "diagnose", "pipeline", "capture", "commands"},
    "gate": {"trace", "analysis", "diagnose", "pipeline", "capture", "commands"},
}


def _imports(path: Path) -> set[str]:
    """overlapcheck submodules imported anywhere in a file, as slash paths ('analysis/metrics')."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("overlapcheck"):
            base = node.module.split(".")[1:]
            out.add("/".join(base))
            out.update("/".join([*base, a.name]) for a in node.names)
        elif isinstance(node, ast.Import):
            out.update("/".join(a.name.split(".")[1:]) for a in node.names if a.name.startswith("overlapcheck."))
    return out


def _part(path: Path) -> list[str]:
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = list(rel.parts)
    return ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_import_runs_against_the_flow(path: Path) -> None:
    imported = _imports(path)
    for part in _part(path):
        for banned in FORBIDDEN.get(part, ()):
            bad = sorted(i for i in imported if i == banned or i.startswith(banned + "/"))
            assert not bad, f"{path.relative_to(PACKAGE)} ({part}) imports {bad}, against docs/architecture.md"


def test_rules_are_one_explicit_list_without_import_side_effects() -> None:
    from overlapcheck.diagnose import registry

    ids = [r.id for r in registry.RULES]
    assert len(ids) == len(set(ids))
    assert all(sum(fn is not None for fn in (r.find, r.cross, r.residual)) == 1 for r in registry.RULES)
    for path in (PACKAGE / "diagnose").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        assert "__dict__[" not in text, f"{path.name} caches by writing into an object's __dict__"
        assert "SEVERITY_CAP[" not in text and "@rank_rule" not in text


def test_orchestration_imports_no_rule_module() -> None:
    # the pipeline and the diagnosis' orchestration reach rules only through the registry
    for path in (PACKAGE / "pipeline.py", PACKAGE / "diagnose" / "__init__.py", PACKAGE / "diagnose" / "locate.py"):
        assert not [i for i in _imports(path) if i.startswith("diagnose/rules")], path.name


def test_report_package_holds_renderers_only() -> None:
    stages = {"compare.py", "gate.py"}
    assert not stages & {p.name for p in (PACKAGE / "report").glob("*.py")}


def test_renderers_share_one_interface() -> None:
    from overlapcheck.report import RENDERERS, renderer

    for name in RENDERERS:
        r = renderer(name)
        assert r.name == name and r.extension.startswith(".") and callable(r.render)
