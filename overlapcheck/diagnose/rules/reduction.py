"""Gradients all-reduced where ZeRO would reduce-scatter them (`zero_optimization.reduce_scatter: false`):
twice the bus bytes of a reduce-scatter (facts/allreduce.py)."""

from __future__ import annotations

from typing import Any

from overlapcheck.analysis import intervals as iv
from overlapcheck.diagnose.facts.allreduce import gradient_allreduces
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.finding import finding, make_fix
from overlapcheck.diagnose.locators import exposed_blames
from overlapcheck.diagnose.rule import Rule
from overlapcheck.model import Finding


def gradient_allreduce(view: RankFacts) -> list[Finding]:
    """Gradient buckets all-reduced instead of reduce-scattered (facts/allreduce.py `gradient_allreduces`:
    DeepSpeed stage3.py __avg_scatter_contiguous_grads with reduce_scatter false). Cost: what reduce-scatters
    of the same buckets no longer keep exposed, half of each all-reduce's transfer at the best rate measured, at
    most its exposed time. Fix: `zero_optimization.reduce_scatter: true`."""
    found = gradient_allreduces(view)
    if found is None:
        return []
    covers = found.saved
    cost = iv.length(covers) / view.n_steps
    if cost <= 0:
        return []
    rows = found.rows
    evidence: dict[str, Any] = {
        "reduce_scatter": False if found.source == "ds_config" else None,
        "evidence_from": found.source,
        "all_reduces_per_step": round(len(rows) / view.n_steps, 2),
        "kernel": view.names[view.gpu.name[rows[0]]],
        "exposed_us_per_step": round(found.exposed_us / view.n_steps, 3),
    }
    if found.bytes_total > 0:
        evidence["all_reduce_bytes_per_step"] = int(found.bytes_total / view.n_steps)
    why = (
        "the gradient buckets are all-reduced, not reduce-scattered ("
        + (
            "zero_optimization.reduce_scatter is false"
            if found.source == "ds_config"
            else "issued under DeepSpeed's __avg_scatter_contiguous_grads / __avg_scatter_grads"
        )
        + "): each GPU moves 2(n-1)/n of every bucket instead of (n-1)/n, twice the bytes a reduce-scatter "
        "needs, and keeps the whole reduced bucket only to drop all but its partition"
    )
    return [
        finding(
            GRADIENT_ALLREDUCE.id,
            "Gradients are all-reduced instead of reduce-scattered",
            why,
            cost,
            [view.rank_id],
            view.steps_of_rows(rows),
            evidence,
            make_fix(view.config, {"zero_optimization.reduce_scatter": True}),
            covers=covers,
        )
    ]


# twice the bytes of a reduce-scatter: the half the reduce-scatter saves is this rule's, not the transfer limit's
GRADIENT_ALLREDUCE = Rule(
    "gradient-allreduce", gradient_allreduce, blame=exposed_blames, explains=("reduce-transfer-bound",)
)
