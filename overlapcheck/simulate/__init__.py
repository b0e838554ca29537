"""A ZeRO-3 trace simulator with exact ground truth (`overlapcheck simulate`); see docs/simulator.md."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from overlapcheck.errors import UserError
from overlapcheck.simulate.config import LATE_FIELDS, SimConfig
from overlapcheck.simulate.scenarios import CAUSES, INHERENT, build_config
from overlapcheck.simulate.sim import BASE_TIME_NS, TS_ORIGIN_US, simulate
from overlapcheck.simulate.truth import bandwidth_truth, mean_step_time, module_truth, set_truth
from overlapcheck.simulate.writer import write_json, write_trace

TRUTH_SCHEMA = "overlapcheck.truth/1"

__all__ = ["build_config", "generate", "simulate", "truth_document"]


def trace_name(rank: int) -> str:
    return f"rank{rank}.trace.json.gz"


def cause_costs(cfg: SimConfig, causes: list[str], base_step_us: float, measure: bool = True) -> list[dict[str, Any]]:
    """Each cause with its per-step cost: this job minus the same job without the effect (None when
    `measure` is off, which skips the counterfactual simulations)."""
    out = []
    for key in causes:
        cause = CAUSES[key]
        step_us = None
        if measure:
            without = cfg.with_overrides(cause.counterfactual(cfg))
            step_us = round(mean_step_time(simulate(without)), 3)
        out.append(
            {
                "rule": cause.rule or key,
                "cost_us": None if step_us is None else round(base_step_us - step_us, 3),
                "fix": cause.fix(cfg),
                "ranks": cause.ranks(cfg),
                "step_time_without_us": step_us,
                **cause.extra(cfg),
            }
        )
    return sorted(out, key=lambda c: -(c["cost_us"] or 0.0))


def free_comm(cfg: SimConfig, base_step_us: float) -> dict[str, float]:
    """Per collective kind, the step time saved if those collectives took no time (an upper bound for
    any cause that makes them exposed, e.g. all-gathers the compute stream waits for)."""
    out = {}
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        free = cfg.with_overrides({"free_collectives": (kind,)})
        out[kind] = round(base_step_us - mean_step_time(simulate(free)), 3)
    return out


def truth_document(
    cfg: SimConfig, causes: list[str], costs: bool = True, inherent_costs: bool = True
) -> tuple[Any, dict[str, Any]]:
    """Simulate `cfg`; return the result and its truth.json document (`costs`: run the counterfactuals;
    `inherent_costs` off: only those of the planted causes, the inherent behaviours and free_comm_us unmeasured)."""
    rest = costs and inherent_costs
    result = simulate(cfg)
    ranks = set_truth(result, [trace_name(r) for r in range(cfg.world_size)])
    step_us = mean_step_time(result)
    config = asdict(cfg)
    for name in LATE_FIELDS:  # fields added later appear only where set, so older sets stay byte-identical
        if config[name] == SimConfig.__dataclass_fields__[name].default:
            del config[name]
    config["model"]["parameters"] = cfg.model.parameters
    doc = {
        "schema": TRUTH_SCHEMA,
        "scenario": cfg.scenario,
        "config": config,
        "time_base": {
            "baseTimeNanoseconds": BASE_TIME_NS,
            "ts_origin_us": TS_ORIGIN_US,
            "clock_offset_us": list(cfg.clock_offset_us),
            **({"ts_is_absolute": True} if cfg.layout == "ds013" else {}),  # ts = baseTimeNanoseconds/1000 + ...
        },
        "step_time_us": round(step_us, 3),
        "causes": cause_costs(cfg, causes, step_us, costs),
        "inherent": cause_costs(cfg, [r for r in INHERENT if r not in causes], step_us, rest),
        "free_comm_us": free_comm(cfg, step_us) if rest else None,
        "ranks": ranks,
        "bandwidth": bandwidth_truth(result),
    }
    if cfg.module_frames:  # docs/simulator.md, Module frames
        doc["modules"] = {str(run.rank): module_truth(run) for run in result.ranks}
    return result, doc


def ds_config_document(cfg: SimConfig) -> dict[str, Any]:
    """ds_config.json: the job's DeepSpeed config plus what diagnosis may need about the job."""
    doc = cfg.ds_config()
    m = cfg.model
    if cfg.layout == "ds013":  # DS #5201's traces came with the DeepSpeed config alone: the model size is unknown
        doc["_overlapcheck_job"] = _job(cfg)
        return doc
    doc["_overlapcheck_model"] = {
        "parameters": m.parameters,
        "hidden": m.hidden,
        "layers": m.layers,
        "vocab": m.vocab,
        "seq_len": m.seq_len,
    }
    doc["_overlapcheck_job"] = _job(cfg)
    return doc


def _job(cfg: SimConfig) -> dict[str, Any]:
    """What a run manifest would say about the job (cluster shape, versions, environment)."""
    return {
        "nodes": cfg.nodes,
        "gpus_per_node": cfg.gpus_per_node,
        "gpu": cfg.gpu,
        "torch": cfg.torch_version,
        "deepspeed": cfg.deepspeed_version,
        "nccl": cfg.nccl_version,
        **({"env": cfg.env()} if cfg.env_recorded else {}),
    }


def _only_a_simulation(out: Path) -> None:
    """UserError unless the non-empty folder `out` is an earlier simulation, which --force may replace: its
    truth.json is the simulator's. A folder of real traces (or anything else) is never overwritten, even with
    --force: simulate deletes rank*.trace.json.gz there and writes ds_config.json and truth.json."""
    if not any(out.iterdir()):
        return
    try:
        with open(out / "truth.json", "rb") as fh:
            doc = json.loads(fh.read(1 << 20))
        simulated = isinstance(doc, dict) and doc.get("schema") == TRUTH_SCHEMA
    except (OSError, ValueError, RecursionError):
        simulated = False
    if not simulated:
        raise UserError(
            f"{out} holds files that no simulation wrote (no simulator truth.json there), never replaced, even "
            "with --force: choose an empty or new folder"
        )
    foreign = _foreign_traces(out, doc)
    if foreign:
        raise UserError(
            f"{out / foreign[0]} is no trace of the simulation there (another rank, or written after its "
            "truth.json), never deleted, even with --force: move it or choose another --out"
        )


def _foreign_traces(out: Path, truth: dict[str, Any]) -> list[str]:
    """The rank*.trace.json.gz in an earlier simulation's folder that it did not write: a rank outside its world,
    or a file changed after its truth.json (written last)."""
    config: dict[str, Any] = truth["config"] if isinstance(truth.get("config"), dict) else {}
    nodes, per_node = config.get("nodes"), config.get("gpus_per_node")
    world = nodes * per_node if isinstance(nodes, int) and isinstance(per_node, int) else 0
    ours = {trace_name(rank) for rank in range(min(world, 1 << 20))}
    written = (out / "truth.json").stat().st_mtime_ns
    return sorted(
        p.name
        for p in out.glob("rank*.trace.json.gz")
        if p.name not in ours or (not p.is_symlink() and p.is_file() and p.stat().st_mtime_ns > written)
    )


def _make_folder(out: Path) -> None:
    """Create `out` (and its parents); UserError, one line, where it cannot be: a broken link or a link loop in
    its place, a file among its parents, no permission."""
    if out.is_symlink() and not out.exists():
        raise UserError(f"{out} is a symbolic link to nothing (or a link loop): remove it or choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{out}: cannot create the output folder: {exc.strerror or exc}") from None


def generate(
    scenario: str,
    out: Path,
    force: bool = False,
    costs: bool = True,
    progress: Callable[[str], None] | None = None,
    inherent_costs: bool = True,
    **options: Any,
) -> dict[str, Any]:
    """Write the trace set of `scenario` into `out`; returns the truth document. `progress(line)` hears what it
    is doing (the simulation and its counterfactuals, then the writing). `costs` off skips every counterfactual,
    `inherent_costs` off those of the inherent behaviours and of free_comm_us (their costs are then null, as with
    `costs` off), for a caller that needs only what the planted causes cost."""
    say = progress or (lambda line: None)
    cfg, causes = build_config(scenario, **options)
    if out.exists() and not out.is_dir():
        raise UserError(f"{out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UserError(f"{out} is not empty; pass --force to overwrite")
    if force and out.is_dir():
        _only_a_simulation(out)
    _make_folder(out)
    if force:
        olds = list(out.glob("rank*.trace.json.gz"))
        folders = [p.name for p in olds if p.is_dir() and not p.is_symlink()]
        if folders:
            raise UserError(f"{out / folders[0]} is a folder named like a trace, never deleted: move it or choose "
                            "another --out")  # fmt: skip
        for old in olds:
            old.unlink()
        for name in ("ds_config.json", "truth.json"):  # a link there is replaced, never the file it points to
            if (out / name).is_symlink():
                (out / name).unlink()
    say(f"simulating {cfg.world_size} ranks" + (", and the job without each effect (the costs)" if costs else ""))
    result, truth = truth_document(cfg, causes, costs, inherent_costs)
    for i, run in enumerate(result.ranks):
        write_trace(cfg, run, out / trace_name(run.rank))
        if i % 8 == 7 or i == len(result.ranks) - 1:
            say(f"wrote {i + 1} of {len(result.ranks)} rank traces")
    write_json(out / "ds_config.json", ds_config_document(cfg))
    write_json(out / "truth.json", truth)
    return truth
