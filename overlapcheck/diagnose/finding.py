"""Helpers the rules build findings with: the Finding itself, its severity, and its `fix`.

A fix is machine-applicable: `config` maps dotted ds_config paths to values, `env` maps variables to values
(None = unset it), `upgrade` is a pip requirement. A fix never suggests what the config already sets.
"""

from __future__ import annotations

from typing import Any

from overlapcheck.analysis import intervals as iv
from overlapcheck.model import Finding, Fix

# ds_config keys that DeepSpeed also accepts at the top level of zero_optimization without the prefix
_ZERO_ALIASES = {
    "zero_optimization.stage3_prefetch_bucket_size": "zero_optimization.prefetch_bucket_size",
    "zero_optimization.stage3_max_live_parameters": "zero_optimization.max_live_parameters",
    "zero_optimization.stage3_param_persistence_threshold": "zero_optimization.param_persistence_threshold",
}


def finding(
    rule: str,
    title: str,
    why: str,
    cost_us: float,
    ranks: list[int],
    steps: list[int],
    evidence: dict[str, Any],
    fix: Fix | None = None,
    covers: iv.Intervals | dict[int, float] | None = None,
) -> Finding:
    """A rank's finding. Its severity is set by the diagnosis from its cost (diagnose/__init__.py), first against
    its own rank's step, then across ranks; `info` until then. `covers`: the windows of the rank's trace where
    the compute idle it charges lies (what it explains of the exposed communication); for a cross-rank finding,
    rank -> the exposed µs per step it explains on that rank."""
    return Finding(
        rule=rule,
        severity="info",
        title=title,
        why=why,
        cost_us=round(float(cost_us), 3),
        ranks=sorted(ranks),
        steps=sorted(steps),
        evidence=evidence,
        fix=fix or Fix(),
        covers=covers,
    )


def config_value(config: dict[str, Any] | None, path: str) -> Any:
    """The value at a dotted path of the ds_config (None when absent); knows DeepSpeed's stage3_ aliases."""
    if not config:
        return None
    for p in (path, _ZERO_ALIASES.get(path, path)):
        node: Any = config
        for part in p.split("."):
            if not isinstance(node, dict) or part not in node:
                node = None
                break
            node = node[part]
        if node is not None:
            return node
    return None


def make_fix(
    config: dict[str, Any] | None,
    settings: dict[str, Any] | None = None,
    env: dict[str, str | None] | None = None,
    upgrade: str | None = None,
) -> Fix:
    """A `fix` without the settings the config already has."""
    wanted = {k: v for k, v in (settings or {}).items() if config_value(config, k) != v}
    return Fix(config=wanted or None, env=dict(env) if env else None, upgrade=upgrade or None)


def round_size(n: float) -> int:
    """A bucket size people write in configs: two significant digits (e.g. 48_000_000)."""
    n = max(1.0, float(n))
    digits = len(str(int(n))) - 2
    return int(round(n / 10**digits) * 10**digits) if digits > 0 else int(n)


def sci(n: float) -> str:
    """500000000 -> '5e8', 50000000 -> '5e7', 12345 -> '12345' (how DeepSpeed configs write sizes)."""
    mantissa, exponent = f"{float(n):.1e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}" if int(exponent) >= 5 else str(int(n))
