"""Every simulator preset, old and new, at 2 nodes x 4 GPUs, and at 4 nodes x 8 GPUs those whose cause or false
alarm can depend on the rank count or the node layout: the top finding is the planted cause that costs most (with
the truth's fix, its rank for a straggler, its call site for a wait), and a preset whose planted causes cost nothing
measurable gets no warning. Generated here, not read from sample_traces/, so that the sizes differ from the ones the
rules were first checked on.

Which presets run at 4x8 (CROSS_RANK) is decided from the rules' code. Only the cross-rank rules (`Rule(cross=...)`)
read other ranks: straggler and slow-node (rules/stragglers.py: each collective's shortest duration across ranks,
the median rank, the node layout), bandwidth-bound (rules/bandwidth.py: the transfer floor across ranks, less the
median rank's fp32-communication cost) and peer-wait (rules/exposure.py). Every other rule judges one rank's own
events (`[view.rank_id]`), so a preset whose planted cause is one of those and touches nothing a cross-rank rule
reads proves at 2x4 what it would at 4x8. Kept at 4x8:
- straggler, slow-node, partial-straggler, host-straggler: the planted cause is a cross-rank rule's, and the late
  rank or node is found among 32 ranks on 4 nodes, not 8 on 2;
- clock-skew: node clocks apart across 4 nodes must change no cross-rank finding (durations only, never timestamps);
- degraded-network, reduce-throttle, throttle-delayed-gathers: bandwidth-bound is planted (a slow fabric); its
  floor is the shortest duration across ranks and the ring's bytes grow with the rank count;
- fp32-comm: bandwidth-bound subtracts the median rank's fp32-communication cost from its floor, so whether a
  false bandwidth-bound shows beside it depends on the floor at that size;
- seed-5201, seed-5201-fixed (and the ds013 layout): the motivating 4x8 job;
- healthy: no false warning (a straggler, peer-wait or bandwidth-bound) at 32 ranks.
The rest (syncs, buckets, streams, waits, offload copies: per-rank rules) run at 2x4 only. They plant the same
effect on every rank, so the cross-rank rules see them as they see healthy: a false straggler, peer-wait or
bandwidth-bound at 32 ranks (which would also explain away their per-rank finding) shows on healthy at 4x8."""

from __future__ import annotations

from typing import Any

import pytest
from builders import SimulatedSets

from overlapcheck.diagnose.rule import WARNING_SHARE
from overlapcheck.model import Finding, Report
from overlapcheck.pipeline import analyze
from overlapcheck.simulate.scenarios import PRESETS

SIZES = {"2x4": (2, 4), "4x8": (4, 8)}
CROSS_RANK = {  # run at 4x8 too (module docstring)
    "clock-skew",
    "degraded-network",
    "fp32-comm",
    "healthy",
    "host-straggler",
    "partial-straggler",
    "reduce-throttle",
    "seed-5201",
    "seed-5201-fixed",
    "slow-node",
    "straggler",
    "throttle-delayed-gathers",
}
RANKED_SHARE = 0.01  # a planted cause under 1 % of the step has no effect worth ranking (docs/simulator.md)


# The diagnosis of a set, once per worker; the set itself once per session (conftest.py's `simulated`, shared with
# the test files that simulate the same presets). Only the planted causes are costed: these tests look at their
# costs and at the report, never at the inherent costs or free_comm_us (1 + causes simulations instead of 8).
_REPORTS: dict[tuple[str, str, str], tuple[dict[str, Any], Report]] = {}


def diagnosed(
    preset: str, size: str, simulated: SimulatedSets, layout: str = "default"
) -> tuple[dict[str, Any], Report]:
    key = (preset, size, layout)
    if key not in _REPORTS:
        nodes, gpus = SIZES[size]
        options = {} if layout == "default" else {"layout": layout}
        out, truth = simulated.get(preset, nodes=nodes, gpus_per_node=gpus, inherent_costs=False, **options)
        _REPORTS[key] = truth, analyze(out, jobs=1)  # in this process: the xdist workers have the cores
    return _REPORTS[key]


def test_the_4x8_presets_are_presets() -> None:
    assert set(PRESETS) >= CROSS_RANK, CROSS_RANK - set(PRESETS)


def planted(truth: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in truth["causes"] if c["cost_us"] >= RANKED_SHARE * truth["step_time_us"]]


def describe(findings: list[Finding]) -> list[tuple[str, str, float]]:
    return [(f.rule, f.severity, f.cost_us) for f in findings[:4]]


@pytest.mark.parametrize(
    ("preset", "size"),
    [(p, size) for p in sorted(PRESETS) for size in sorted(SIZES) if size == "2x4" or p in CROSS_RANK],
)
def test_top_finding_is_the_planted_cause(preset: str, size: str, simulated: SimulatedSets) -> None:
    truth, report = diagnosed(preset, size, simulated)
    causes = planted(truth)
    if not causes:
        warnings = [f for f in report.findings if f.severity != "info"]
        assert warnings == [], f"{preset} {size}: nothing planted costs anything, yet {describe(warnings)}"
        return
    top = max(causes, key=lambda c: c["cost_us"])
    assert report.findings, f"{preset} {size}: no finding for {top['rule']}"
    first = report.findings[0]
    assert first.rule == top["rule"], f"{preset} {size}: top {describe(report.findings)}, planted {top['rule']}"
    if top["cost_us"] >= WARNING_SHARE * truth["step_time_us"]:
        assert first.severity in ("critical", "warning")
    if top["rule"] in ("straggler", "slow-node"):
        assert first.ranks == top["ranks"]
        if "late_on" in top:
            assert first.evidence.get("late_on") == top["late_on"]
    elif "call_site" in top:
        assert first.evidence.get("call_site") == top["call_site"]
    else:
        assert first.fix.__dict__ == {
            "config": top["fix"].get("config"),
            "env": top["fix"].get("env"),
            "upgrade": top["fix"].get("upgrade"),
        }
    # the other planted causes are listed too
    rules = [f.rule for f in report.findings]
    for cause in causes:
        assert cause["rule"] in rules, f"{preset} {size}: {cause['rule']} missing from {rules}"


@pytest.mark.parametrize(
    "scenario",
    ["host-straggler+throughput-timer", "user-wait-stream+throughput-timer", "partial-straggler+comms-logger"],
)
def test_interacting_causes_are_each_listed_and_ranked_by_cost(scenario: str, simulated: SimulatedSets) -> None:
    truth, report = diagnosed(scenario, "2x4", simulated)
    causes = planted(truth)
    assert len(causes) >= 2, truth["causes"]
    found = {f.rule: f for f in report.findings}
    ranked = [f.rule for f in report.findings]
    for cause in causes:
        assert cause["rule"] in found, f"{scenario}: {cause['rule']} missing from {ranked}"
    first, second = sorted(causes, key=lambda c: -c["cost_us"])[:2]
    if first["cost_us"] > 1.25 * second["cost_us"]:  # clearly apart: ranked the same way
        assert ranked.index(first["rule"]) < ranked.index(second["rule"]), describe(report.findings)


SEED_COST_TOLERANCE = 0.15  # GitHub issue 25: the seed's deferral costed within 15 % of the counterfactual


@pytest.mark.parametrize("size", sorted(SIZES))
@pytest.mark.parametrize("layout", ["default", "ds013"])
def test_seed_deferral_is_first_with_its_fix_and_cost_in_both_layouts(
    layout: str, size: str, simulated: SimulatedSets
) -> None:
    """DS #5201 as the simulator writes it now and as its own stack (DeepSpeed 0.13.3, torch 1.13.1, NCCL 2.14:
    no record_param_comms sizes, no parameter count in ds_config.json) wrote it."""
    # the default layout's set is the one test_top_finding_is_the_planted_cause diagnosed (same cache key)
    truth, report = diagnosed("seed-5201", size, simulated, layout)
    top = max(truth["causes"], key=lambda c: c["cost_us"])
    assert top["rule"] == "reduce-scatter-deferred"
    first = report.findings[0]
    assert first.rule == top["rule"], describe(report.findings)
    assert first.fix.__dict__ == {"config": top["fix"].get("config"), "env": None, "upgrade": None}
    assert abs(first.cost_us / top["cost_us"] - 1) < SEED_COST_TOLERANCE, (first.cost_us, top["cost_us"])
    timer = next(f for f in report.findings if f.rule == "throughput-timer-sync")
    assert timer.fix.__dict__ == {"config": None, "env": None, "upgrade": "deepspeed>=0.14.3"}  # no such key in 0.13
