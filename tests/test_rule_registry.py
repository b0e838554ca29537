"""Every registered rule is one complete object (docs/architecture.md, "A rule"): documented in docs/rules.md,
with a way to find the events its findings blame, and tested on a hand-built trace that shows its symptom without
its cause (`@pytest.mark.symptom_without_cause("rule-id")` on that test). Nothing outside the rules names an id."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from overlapcheck.diagnose.registry import RULES

ROOT = Path(__file__).resolve().parents[1]
RULE_IDS = [rule.id for rule in RULES]


def _documented() -> set[str]:
    text = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    return set(re.findall(r"^\| `([a-z0-9-]+)` \|", text, flags=re.MULTILINE))


def _negative_tests() -> dict[str, list[str]]:
    """rule id -> the tests marked as showing its symptom without its cause."""
    out: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            for dec in node.decorator_list:
                if (
                    isinstance(dec, ast.Call)
                    and isinstance(dec.func, ast.Attribute)
                    and dec.func.attr == "symptom_without_cause"
                ):
                    for arg in dec.args:
                        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                            out.setdefault(arg.value, []).append(f"{path.name}::{node.name}")
    return out


@pytest.mark.parametrize("rule", RULE_IDS)
def test_rule_is_documented(rule: str) -> None:
    assert rule in _documented(), f"{rule} has no row in docs/rules.md's rule table"


@pytest.mark.parametrize("rule", RULES, ids=RULE_IDS)
def test_rule_says_where_its_findings_happen(rule) -> None:
    # per-rank rules point at events; a cross-rank finding names ranks, and its per-rank part is in `covers`
    if rule.cross is None:
        assert rule.blame is not None, f"{rule.id} has no blame locator"


@pytest.mark.parametrize("rule", RULE_IDS)
def test_rule_has_a_symptom_without_its_cause(rule: str) -> None:
    assert _negative_tests().get(rule), (
        f"no test is marked @pytest.mark.symptom_without_cause({rule!r}): build the trace that shows its symptom "
        "without its cause"
    )


def test_marks_name_registered_rules() -> None:
    assert set(_negative_tests()) <= set(RULE_IDS)


def test_no_module_outside_the_rules_names_a_rule_id() -> None:
    """Only a rule's own module (and the registry's list) says its id; orchestration, facts and renderers branch
    on rule attributes, never on ids."""
    quoted = re.compile("|".join(re.escape(f'"{rule}"') for rule in RULE_IDS))
    allowed = {"diagnose/rules", "diagnose/registry.py", "simulate"}  # the simulator plants causes by id
    offenders = []
    for path in sorted((ROOT / "overlapcheck").rglob("*.py")):
        rel = path.relative_to(ROOT / "overlapcheck").as_posix()
        if any(rel.startswith(a) for a in allowed):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if quoted.search(line.split("#")[0]):
                offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "rule ids outside their rules:\n" + "\n".join(offenders)
