"""The communication dtype against the training dtype: gradient reductions that move fp32 under bf16 / fp16
training send twice the bytes they need (facts/dtypes.py)."""

from __future__ import annotations

from typing import Any

from overlapcheck.analysis import intervals as iv
from overlapcheck.analysis.bandwidth import message_bytes
from overlapcheck.diagnose.facts.dtypes import fp32_reductions
from overlapcheck.diagnose.facts.sizing import RS
from overlapcheck.diagnose.facts.view import RankFacts
from overlapcheck.diagnose.finding import config_value, finding, make_fix
from overlapcheck.diagnose.locators import exposed_blames
from overlapcheck.diagnose.rule import Rule
from overlapcheck.model import Finding


def fp32_communication(view: RankFacts) -> list[Finding]:
    """Gradient reductions in fp32 under bf16 / fp16 training (facts/dtypes.py `fp32_reductions`: DeepSpeed
    runtime/config.py get_communication_data_type, stage3.py __avg_scatter_grads; `_f32` NCCL kernels, Float
    records). Cost: what the reductions in the training dtype no longer keep exposed, half of each one's
    transfer at the best rate measured, at most its exposed time. Fix: `communication_data_type` = the training
    dtype."""
    found = fp32_reductions(view)
    if found is None:
        return []
    covers = found.saved
    cost = iv.length(covers) / view.n_steps
    if cost <= 0:
        return []
    g = view.gpu
    fp32, train, train_from, sized = found.rows, found.training, found.training_from, found.sized
    nbytes = message_bytes(view.model)
    configured = config_value(view.config, "communication_data_type")
    kind = "reduce_scatter" if (g.coll[fp32] == RS).any() else "all_reduce"
    evidence: dict[str, Any] = {
        "training_dtype": train,
        "training_dtype_from": train_from,
        "communication_data_type": configured,
        "collective": kind,
        "fp32_per_step": round(len(fp32) / view.n_steps, 2),
        "fp32_share": round(found.share, 4),
        "kernel": view.names[g.name[fp32[0]]],
        "exposed_us_per_step": round(found.exposed_us / view.n_steps, 3),
    }
    if sized:
        evidence["fp32_bytes_per_step"] = int(nbytes[fp32].sum() / view.n_steps)
        evidence[f"{train}_bytes_per_step"] = int(nbytes[fp32].sum() / view.n_steps / 2)
    why = (
        f"the {kind.replace('_', '-')}s move fp32 ({evidence['kernel'].split('(')[0]}, dtype Float) under "
        f"{train} training ({train_from}): twice the bytes; "
        + (
            f"communication_data_type {configured!r} asks for that"
            if configured is not None
            else "the config does not say communication_data_type (or the trace came without it)"
        )
        + f"; in {train} each transfer takes half as long"
    )
    return [
        finding(
            FP32_COMMUNICATION.id,
            f"Gradients are reduced in fp32 under {train} training",
            why,
            cost,
            [view.rank_id],
            view.steps_of_rows(fp32),
            evidence,
            make_fix(view.config, {"communication_data_type": train}),
            covers=covers,
        )
    ]


# twice the bytes of the training dtype (reduce-transfer-bound leaves the windows it saves to it); reductions
# twice as long keep more in flight, so the reduce throttle's blocks are partly its cost (counted once)
FP32_COMMUNICATION = Rule(
    "fp32-communication", fp32_communication, blame=exposed_blames, explains=("reduce-event-throttle",)
)
