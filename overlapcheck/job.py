"""What is known about the job besides its traces: one typed context that every diagnosis rule receives.

The pipeline reads the sources once (docs/architecture.md) and builds the context here, the only place that
knows where each fact comes from:
- the DeepSpeed config: `--ds-config`, else `ds_config.json` beside the traces, else the one in `run.json`;
- the run manifest `run.json` written by `overlapcheck run` (versions, environment, hosts);
- model facts: `model.json` beside the traces (`{"parameters": N}`);
- the simulator's job description, kept in its `ds_config.json` under `_overlapcheck_job` and
  `_overlapcheck_model` (taken out of the config the rules see).

The config the rules see is *sanitized* here, once (`sanitize_config`): every key a rule reads has the type
DeepSpeed gives it, or is absent. `"auto"` (what the Hugging Face Trainer writes, resolved only at run time) is
taken from the engine-resolved config in `run.json` when it has the key, else left out; a value of the wrong
type (a list, a string, NaN, Infinity, a bool where a number is meant, a number beyond any real size) is left
out. Each is said in `JobContext.notes` (the report's `notes`), naming the key.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from overlapcheck.errors import UserError

RUN_SCHEMA = "overlapcheck.run/1"  # the run manifest `overlapcheck run` writes (capture/manifest.py)
SIMULATOR_JOB_KEY = "_overlapcheck_job"
SIMULATOR_MODEL_KEY = "_overlapcheck_model"


_NETWORK = re.compile(r"^(?:(\d+)\s*[x*]\s*)?(\d+(?:\.\d+)?)\s*(Gbps|Gb/s|GB/s|GBps|Tbps|Tb/s)$")


@dataclass(frozen=True)
class Network:
    """The inter-node network of one node as the user states it (`--network 4x200Gbps`): links x rate."""

    spec: str
    links: int
    link_gbps: float  # one link, GB/s (1e9 bytes/s) per direction

    @property
    def node_gbps(self) -> float:
        return self.links * self.link_gbps

    def per_gpu_gbps(self, gpus_per_node: int) -> float:
        """The per-GPU share of the node's links: the peak an inter-node collective's busbw is compared with."""
        return self.node_gbps / max(1, gpus_per_node)

    def to_dict(self, gpus_per_node: int | None) -> dict[str, Any]:
        return {
            "spec": self.spec,
            "links": self.links,
            "link_gbps": self.link_gbps,
            "node_gbps": self.node_gbps,
            "gpus_per_node": gpus_per_node,
            "per_gpu_gbps": self.per_gpu_gbps(gpus_per_node) if gpus_per_node else None,
        }


def parse_network(text: str) -> Network:
    """`4x200Gbps`, `400Gbps`, `8x25GB/s`, `2x1.6Tbps` -> Network; UserError (one line) otherwise."""
    m = _NETWORK.match(text.strip())
    links = int(m.group(1)) if m and m.group(1) else 1
    rate = float(m.group(2)) if m else 0.0
    if m is None or not 1 <= links <= 1 << 16 or not 0 < rate < 1e9:
        raise UserError(
            f"--network {text!r} is not a network like 4x200Gbps, 400Gbps or 8x25GB/s (links x rate per node)"
        )
    unit = m.group(3)
    gbps = rate if unit in ("GB/s", "GBps") else rate / 8.0 * (1000.0 if unit in ("Tbps", "Tb/s") else 1.0)
    return Network(text.strip(), links, gbps)


@dataclass(frozen=True)
class JobContext:
    """The job's configuration and facts; every field may be unknown (None)."""

    ds_config: dict[str, Any] | None = None  # the DeepSpeed config, without overlapcheck's own keys
    run: dict[str, Any] | None = None  # the run manifest, as written
    parameters: int | None = None  # trainable parameters
    parameters_source: str | None = None  # "config" (the simulator's job description) or "model.json"
    gpus_per_node: int | None = None
    env: dict[str, Any] | None = None  # the job's environment variables, when recorded
    deepspeed_version: str | None = None
    network: Network | None = None  # `--network`: the node's inter-node links, as the user states them
    notes: tuple[str, ...] = ()  # what was left out of or resolved in the config (the report's `notes`)

    @property
    def hosts(self) -> dict[int, str]:
        """Rank -> host, from the run manifest's `ranks[].rank` / `ranks[].host` (empty without one)."""
        out: dict[int, str] = {}
        entries = (self.run or {}).get("ranks")
        for entry in entries if isinstance(entries, list) else []:
            if isinstance(entry, dict):
                rank, host = entry.get("rank"), entry.get("host")
                if (
                    isinstance(rank, int)
                    and not isinstance(rank, bool)
                    and rank >= 0
                    and isinstance(host, str)
                    and host
                ):
                    out[rank] = host
        return out

    @classmethod
    def build(
        cls,
        ds_config: dict[str, Any] | None,
        run: dict[str, Any] | None,
        model: dict[str, Any] | None = None,
        network: Network | None = None,
        found: Sequence[str] = (),
    ) -> JobContext:
        """The context from the documents as read (any may be None or of the wrong shape); `found`: notes on
        the documents found and not read (pipeline.find_inputs), said first."""
        config = ds_config if isinstance(ds_config, dict) else None
        notes: list[str] = list(found)
        schema = (config or {}).get("schema")
        if isinstance(schema, str) and schema.startswith("overlapcheck."):  # a report written as ds_config.json (-o)
            notes.append(
                f"the DeepSpeed config is an overlapcheck document ({schema[:60]!r}), not a ds_config: ignored"
            )
            config = None
        run = run if isinstance(run, dict) else None
        resolved = _dict((run or {}).get("ds_config"))  # the config as the engine resolved it (`overlapcheck run`)
        if config is None and resolved:
            config = resolved
        job = _dict((config or {}).get(SIMULATOR_JOB_KEY))
        sim_model = _dict((config or {}).get(SIMULATOR_MODEL_KEY))
        if run is not None and run.get("schema") != RUN_SCHEMA:
            said = str(run.get("schema"))[:60]
            notes.append(
                f"run.json's schema is {said!r}, not {RUN_SCHEMA!r} (another tool or version wrote it): its fields "
                "were read only where they have the expected types"
            )
        if config is not None:
            config = {k: v for k, v in config.items() if k not in (SIMULATOR_JOB_KEY, SIMULATOR_MODEL_KEY)}
            config, config_notes = sanitize_config(config, resolved if resolved is not config else None)
            notes += config_notes
            if config and not DEEPSPEED_KEYS.intersection(config):
                keys = ", ".join(sorted(str(k)[:40] for k in config)[:5]) + (", ..." if len(config) > 5 else "")
                notes.append(
                    f"the DeepSpeed config holds none of DeepSpeed's keys ({keys}): is it a ds_config? The "
                    "diagnosis treats every key as unset"
                )
        params, source = _parameters(sim_model), "config"
        if params is None:
            params, source = _parameters(_dict(model)), "model.json"
        versions = _dict((run or {}).get("versions"))
        version = versions.get("deepspeed") or job.get("deepspeed")
        env = (run or {}).get("env") if isinstance((run or {}).get("env"), dict) else job.get("env")
        per_node = job.get("gpus_per_node", (run or {}).get("gpus_per_node"))
        return cls(
            ds_config=config,
            run=run,
            parameters=params,
            parameters_source=source if params is not None else None,
            gpus_per_node=per_node if isinstance(per_node, int) and not isinstance(per_node, bool) else None,
            env=env if isinstance(env, dict) else None,
            deepspeed_version=version if isinstance(version, str) else None,
            network=network,
            notes=tuple(notes),
        )


# the ds_config keys the rules read (diagnose/finding.py config_value), by the type DeepSpeed gives them; the
# objects they sit in must be objects. A size is a non-negative number no larger than MAX_CONFIG_NUMBER.
_OBJECTS = (
    "zero_optimization",
    "zero_optimization.offload_optimizer",
    "zero_optimization.offload_param",
    "comms_logger",
    "timers",
    "timers.throughput",
    "bf16",
    "fp16",
)
_NUMBERS = (
    "train_micro_batch_size_per_gpu",
    "train_batch_size",
    "gradient_accumulation_steps",
    "zero_optimization.stage",
    "zero_optimization.reduce_bucket_size",
    "zero_optimization.allgather_bucket_size",
    "zero_optimization.stage3_prefetch_bucket_size",
    "zero_optimization.prefetch_bucket_size",
    "zero_optimization.stage3_param_persistence_threshold",
    "zero_optimization.param_persistence_threshold",
    "zero_optimization.stage3_max_live_parameters",
    "zero_optimization.max_live_parameters",
    "zero_optimization.stage3_max_reuse_distance",
    "zero_optimization.max_reuse_distance",
    "zero_optimization.zero_hpz_partition_size",
    "zero_optimization.sub_group_size",
)
_BOOLS = (
    "zero_optimization.overlap_comm",
    "zero_optimization.contiguous_gradients",
    "zero_optimization.reduce_scatter",
    "zero_optimization.zero_quantized_weights",
    "zero_optimization.zero_quantized_gradients",
    "zero_optimization.log_trace_cache_warnings",
    "zero_optimization.offload_optimizer.pin_memory",
    "zero_optimization.offload_param.pin_memory",
    "comms_logger.enabled",
    "timers.throughput.enabled",
    "timers.throughput.synchronized",
    "bf16.enabled",
    "fp16.enabled",
)
_STRINGS = (
    "communication_data_type",
    "zero_optimization.offload_optimizer.device",
    "zero_optimization.offload_param.device",
)
# DeepSpeed's top-level config keys (deepspeed/runtime/config.py, 0.9-0.19): a config without any is not one
DEEPSPEED_KEYS = frozenset(
    {
        "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "zero_optimization",
        "optimizer", "scheduler", "fp16", "bf16", "amp", "gradient_clipping", "steps_per_print", "prescale_gradients",
        "gradient_predivide_factor", "communication_data_type", "seq_parallel_communication_data_type",
        "wall_clock_breakdown", "memory_breakdown", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
        "activation_checkpointing", "flops_profiler", "comms_logger", "timers", "tensorboard", "wandb",
        "csv_monitor", "comet", "monitor_config", "aio", "checkpoint", "elasticity", "pipeline", "autotuning",
        "compression_training", "data_efficiency", "data_types", "sparse_gradients", "sparse_attention",
        "disable_allgather", "dump_state", "eigenvalue", "progressive_layer_drop", "curriculum_learning",
        "hybrid_engine", "nebula", "compile", "weight_quantization", "torch_autocast", "dataloader_drop_last",
        "load_universal_checkpoint", "use_data_before_expert_parallelism", "graph_harvesting",
    }
)  # fmt: skip
MAX_CONFIG_NUMBER = 1e15  # far beyond any bucket, batch or parameter count; sizes computed from it stay finite
AUTO = "auto"


def _shown(value: object) -> str:
    """A config value as a note shows it: JSON-like and short."""
    text = "NaN" if isinstance(value, float) and math.isnan(value) else repr(value)
    if isinstance(value, float) and math.isinf(value):
        text = "Infinity" if value > 0 else "-Infinity"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = json.dumps(value[:60], ensure_ascii=False)  # control characters escaped
    elif isinstance(value, list):
        text = "a list"
    elif isinstance(value, dict):
        text = "an object"
    return text if len(text) <= 40 else text[:37] + "..."


def _problem(key: str, value: object) -> str | None:
    """Why `value` cannot stand at `key` (None when it can)."""
    if key in _OBJECTS:
        return None if isinstance(value, dict) else "not an object"
    if key in _BOOLS:
        return None if isinstance(value, bool) else "not true or false"
    if key in _STRINGS:
        return None if isinstance(value, str) else "not a string"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "not a number"
    if isinstance(value, int) and abs(value) > MAX_CONFIG_NUMBER:
        return f"larger than {MAX_CONFIG_NUMBER:.0e}" if value > 0 else "negative"  # beyond a float's range too
    if not math.isfinite(value):
        return "not a finite number"
    if value < 0:
        return "negative"
    if value > MAX_CONFIG_NUMBER:
        return f"larger than {MAX_CONFIG_NUMBER:.0e}"
    if isinstance(value, float) and not value.is_integer():  # every key read is a count (5e8 is one)
        return "not a whole number"
    return None


def _lookup(config: dict[str, Any] | None, key: str) -> tuple[bool, Any]:
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def sanitize_config(config: dict[str, Any], resolved: dict[str, Any] | None = None) -> tuple[dict[str, Any], list[str]]:
    """`config` with every key the rules read of the right type (others left out), and the notes that say what was
    left out or resolved. `"auto"` takes the value of `resolved` (run.json's engine-resolved config) where that
    has a good one. The input is not changed; the result shares what needs no change."""
    notes: list[str] = []
    auto_left: list[str] = []
    clean = dict(config)

    def parent(key: str) -> dict[str, Any] | None:
        """The (copied, so writable) object holding `key` in `clean`, None when there is none."""
        node = clean
        for part in key.split(".")[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                return None
            child = dict(child)
            node[part] = child
            node = child
        return node

    for key in (*_OBJECTS, *_NUMBERS, *_BOOLS, *_STRINGS):  # objects first: a bad one takes its keys with it
        found, value = _lookup(clean, key)
        if not found or value is None:
            continue
        holder = parent(key)
        if holder is None:
            continue
        name = key.rsplit(".", 1)[-1]
        if value == AUTO and key not in _STRINGS:
            has, good = _lookup(resolved, key)
            if has and good != AUTO and _problem(key, good) is None:
                holder[name] = good
                notes.append(f'ds_config {key} is "auto": {_shown(good)} from run.json (as the engine resolved it)')
            else:
                del holder[name]
                auto_left.append(key)
            continue
        if (why := _problem(key, value)) is not None:
            del holder[name]
            notes.append(f"ds_config {key} = {_shown(value)} is {why}: ignored (the diagnosis treats it as unset)")
    if auto_left:
        verb = "is" if len(auto_left) == 1 else "are"
        notes.append(
            f'ds_config {", ".join(auto_left)} {verb} "auto" (the Hugging Face Trainer resolves "auto" at run '
            "time, and no run.json says to what): treated as unset"
        )
    return clean, notes


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _texts(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _objects(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


def _counts(value: object) -> bool:
    return isinstance(value, list) and all(_count(v) for v in value)


# run.json's fields as `overlapcheck run` writes them (capture/manifest.py merge), by the test each must pass;
# null is allowed wherever the run may not know the value
_RUN_FIELDS: dict[str, tuple[str, Any]] = {
    "world_size": ("a positive integer", lambda v: _count(v) and 0 < v <= (1 << 31)),
    "gpus_per_node": ("a positive integer", lambda v: _count(v) and v > 0),
    "exit_code": ("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "ds_config": ("an object", lambda v: isinstance(v, dict)),
    "profiler": ("an object", lambda v: isinstance(v, dict)),
    "versions": ("an object", lambda v: isinstance(v, dict)),
    "env": ("an object", lambda v: isinstance(v, dict)),
    "status": ("a string", lambda v: isinstance(v, str)),
    "launcher": ("a string", lambda v: isinstance(v, str)),
    "hosts": ("a list of strings", _texts),
    "notes": ("a list of strings", _texts),
    "gpus": ("a list of strings", _texts),
    "launches": ("a list of objects", _objects),
    "ranks": ("a list of objects", _objects),
    "errors": ("a list of objects", _objects),
    "missing_ranks": ("a list of ranks", _counts),
    "incomplete_ranks": ("a list of ranks", _counts),
}


def sanitize_run(run: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """`run` without the fields that are not of the type `overlapcheck run` writes (`"world_size": "one"`, a
    string of hosts), and one note naming them: such a field is ignored, not guessed at."""
    bad = [
        (key, what)
        for key, (what, valid) in _RUN_FIELDS.items()
        if key in run and run[key] is not None and not valid(run[key])
    ]
    if not bad:
        return run, []
    shown = "; ".join(f"{key} is {_shape(run[key])}, not {what}" for key, what in bad[:6])
    more = f"; and {len(bad) - 6} more" if len(bad) > 6 else ""
    clean = {k: v for k, v in run.items() if k not in dict(bad)}
    return clean, [f"run.json: {shown}{more}: ignored (was it edited, or written by another tool?)"]


def _shape(value: object) -> str:
    """A short description of a JSON value for a note: its type, and the value itself when short."""
    kinds = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list", dict: "an object"}
    kind = kinds.get(type(value), type(value).__name__)
    text = json.dumps(value, ensure_ascii=True) if not isinstance(value, list | dict) else ""
    return f"{kind} {text[:40]}" if text and len(text) <= 40 else kind


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _parameters(doc: dict[str, Any]) -> int | None:
    for key in ("params", "parameters"):
        value = doc.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_CONFIG_NUMBER:
            return value  # a count beyond 1e15 parameters is no model's, and sizes computed from it overflow
    return None
