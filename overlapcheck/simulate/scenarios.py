"""Named presets (`overlapcheck simulate --scenario NAME`, `a+b` combines them) and the planted causes
with their counterfactual (the same job without the effect) and the fix a user would apply."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from overlapcheck.errors import UserError
from overlapcheck.simulate.config import ModelSpec, SimConfig
from overlapcheck.simulate.frames import DATALOADER_FRAMES, USER_GRAD_HOOK
from overlapcheck.simulate.hardware import jitter


@dataclass(frozen=True)
class Preset:
    summary: str
    overrides: dict[str, Any] = field(default_factory=dict)
    causes: tuple[str, ...] = ()  # the rules truth.json names
    variants: dict[str, str] = field(default_factory=dict)  # rule -> the CAUSES key that plants it, when not the rule


BASE = {"nodes": 2, "gpus_per_node": 2, "model.layers": 4}  # small sets unless a preset says otherwise

_SEED: dict[str, Any] = {  # DeepSpeed issue 5201's job
    "nodes": 4,
    "gpus_per_node": 8,
    "gpu": "A100",
    "torch_version": "1.13.1",
    "deepspeed_version": "0.13.3",
    "nccl_version": "2.14.3",
    "reduce_bucket_size": 500_000_000,
    "throughput_timer_sync": True,
    "model.layers": 6,
    "model.micro_batch": 1,
    "clock_skew_us": 2500.0,
}

PRESETS: dict[str, Preset] = {
    "healthy": Preset(
        "ZeRO-3 done right: overlap_comm, 5e7 buckets, prefetch; only the last bucket is exposed",
        {"nodes": 2, "gpus_per_node": 8, "model.layers": 6, "model.micro_batch": 4},
    ),
    "seed-5201": Preset(
        "DS #5201: 4x8 A100, DeepSpeed 0.13.3, torch 1.13.1, bf16, overlap_comm, default 5e8 bucket > 367M "
        "params, so every reduce-scatter waits for the end of backward; throughput-timer syncs; skewed node clocks",
        _SEED,
        ("reduce-scatter-deferred", "throughput-timer-sync"),
    ),
    "seed-5201-fixed": Preset(
        "DS #5201 after its first fix: the same job with reduce_bucket_size 5e7, so the reduce-scatters overlap "
        "backward; the throughput-timer syncs remain (the 'after' of the seed's before/after pair)",
        {**_SEED, "reduce_bucket_size": 50_000_000},
        ("throughput-timer-sync",),
    ),
    "bucket-too-large": Preset(
        "reduce_bucket_size (1e9) above the parameter count: reduce-scatter deferred",
        {"reduce_bucket_size": 1_000_000_000},
        ("reduce-scatter-deferred",),
    ),
    "no-overlap-comm": Preset(
        "overlap_comm: false: side streams are the default stream, comm serialized",
        {"overlap_comm": False},
        ("overlap-comm-disabled",),
    ),
    "comms-logger": Preset(
        "comms_logger enabled: cudaDeviceSynchronize after every collective",
        {"comms_logger": True},
        ("comms-logger-sync",),
    ),
    "throughput-timer": Preset(
        "timers.throughput.synchronized: device syncs at step start and end",
        {"throughput_timer_sync": True},
        ("throughput-timer-sync",),
    ),
    "same-communicator": Preset(
        "all-gather and reduce-scatter on one communicator (mpu DP group): NCCL serializes",
        {"same_communicator": True, "model.micro_batch": 1},
        ("same-communicator",),
    ),
    "max-connections-1": Preset(
        "CUDA_DEVICE_MAX_CONNECTIONS=1: streams execute in launch order, no concurrency",
        {"max_connections_1": True},
        ("no-stream-concurrency",),
    ),
    "serialized-gpu-no-env": Preset(
        "CUDA_DEVICE_MAX_CONNECTIONS=1 set by a launch script that left no record (traces copied off a cluster: "
        "no environment in the job description): streams execute in launch order, only the trace shows it",
        {"max_connections_1": True, "env_recorded": False},
        ("no-stream-concurrency",),
    ),
    "straggler": Preset(
        "one rank's GPU runs 30% slower: the others wait inside their NCCL kernels",
        {"straggler_rank": -1, "straggler_factor": 1.3, "straggler_scope": "all"},
        ("straggler",),
    ),
    "offload-sync": Preset(
        "offload_optimizer on DeepSpeed 0.19.4 without pin_memory: blocking D2H grad copies",
        {"offload_optimizer": True, "deepspeed_version": "0.19.4"},
        ("offload-blocking-copy",),
    ),
    "reduce-throttle": Preset(
        "1e7-element reduce buckets on a congested fabric: more than 2 reductions in flight "
        "make __reduce_and_partition_ipg_grads block on cudaEventSynchronize",
        {"reduce_bucket_size": 10_000_000, "comm_slowdown": 3.0},
        ("reduce-event-throttle", "bandwidth-bound"),  # the congested fabric is planted too
    ),
    "no-prefetch": Preset(
        "stage3_prefetch_bucket_size: 0: every all-gather is issued when its module runs",
        {"prefetch_bucket_size": 0},
        ("allgather-not-prefetched",),
    ),
    "degraded-network": Preset(
        "the healthy job on a network 6x slower than it should be (a missing NCCL_IB_HCA port, no GPUDirect "
        "RDMA): every collective moves its bytes slowly, schedules and syncs are fine",
        {"nodes": 2, "gpus_per_node": 4, "model.layers": 6, "model.micro_batch": 4, "comm_slowdown": 6.0},
        ("bandwidth-bound",),
    ),
    "clock-skew": Preset(
        "healthy job with node clocks 5 ms apart (per-rank metrics must not change)", {"clock_skew_us": 5000.0}
    ),
    "partial-straggler": Preset(
        "one rank's GEMMs and attention run 50% slower (SM clocks; HBM-bound kernels keep their speed), 1e8 "
        "buckets: the prefetched all-gathers absorb it, the reduce-scatters wait for it",
        {"straggler_rank": -3, "straggler_factor": 1.5, "straggler_scope": "math", "reduce_bucket_size": 100_000_000},
        ("straggler",),
        {"straggler": "gpu-straggler"},
    ),
    "host-straggler": Preset(
        "one rank's host waits 8 ms per step in its data loader before the first launch: the others wait in "
        "their first all-gather of the step",
        {"host_delay_rank": -6, "host_delay_us": 8000.0},
        ("straggler",),
        {"straggler": "host-straggler"},
    ),
    "throttle-delayed-gathers": Preset(
        "1e7-element reduce buckets on a 2x slower fabric with a slow backward host (5 ms of submodule hooks per "
        "block): the reduce-event throttle blocks the autograd thread, the GPU drains, the host never catches up",
        {"reduce_bucket_size": 10_000_000, "comm_slowdown": 2.0, "backward_host_us": 5000.0},
        ("reduce-event-throttle", "bandwidth-bound"),  # the slower fabric is planted too
    ),
    "user-wait-stream": Preset(
        "a user gradient hook calls torch.cuda.current_stream().wait_stream(reduce stream): compute waits for "
        "every reduce-scatter",
        {"user_wait_stream": True},
        ("cross-stream-wait",),
        {"cross-stream-wait": "user-wait-stream"},
    ),
    "slow-node": Preset(
        "every GPU of one node runs 35% slower (a throttled node): the last to arrive rotates among its ranks, "
        "the other nodes' ranks wait for them inside their NCCL kernels",
        {"slow_node": -1, "straggler_factor": 1.35, "straggler_scope": "all"},
        ("slow-node",),
    ),
    "harmless-config": Preset(
        "stage3_prefetch_bucket_size 1e6 (50x below the default) with the host far ahead: every fetch still "
        "prefetches the next module, so nothing changes (a healthy variant, no cause)",
        {"prefetch_bucket_size": 1_000_000},
    ),
    "fp32-comm": Preset(
        "communication_data_type: fp32 under bf16 training: every reduce-scatter moves "
        "twice the bytes it needs (_f32 kernels, Float records) and the reductions outlast backward",
        {"communication_data_type": "fp32"},
        ("fp32-communication",),
    ),
    "offload-pageable": Preset(
        "offload_param to CPU without pin_memory: every all-gather first copies its shard from pageable host "
        "memory with a blocking copy in all_gather_coalesced, so the fetching thread waits for each copy",
        {"offload_param": True},
        ("offload-param-copy",),
    ),
}

# the presets of the first sample sets (samples.py, sample_traces/); later ones are not shipped
SAMPLE_PRESETS = (
    "healthy",
    "seed-5201",
    "seed-5201-fixed",
    "bucket-too-large",
    "no-overlap-comm",
    "comms-logger",
    "throughput-timer",
    "same-communicator",
    "max-connections-1",
    "straggler",
    "offload-sync",
    "reduce-throttle",
    "no-prefetch",
    "degraded-network",
    "clock-skew",
)


@dataclass(frozen=True)
class Cause:
    """How to remove an effect (counterfactual overrides) and what the user should change; `rule` is the rule
    truth.json names when it is not the key (several effects can plant one rule), `extra` adds truth fields."""

    counterfactual: Callable[[SimConfig], dict[str, Any]]
    fix: Callable[[SimConfig], dict[str, Any]]
    ranks: Callable[[SimConfig], list[int]] = lambda cfg: list(range(cfg.world_size))
    rule: str | None = None
    extra: Callable[[SimConfig], dict[str, Any]] = lambda cfg: {}


def _timer_fix(cfg: SimConfig) -> dict[str, Any]:
    """`timers.throughput.synchronized` exists from DeepSpeed 0.14.3 (#5363); before, the fix is the upgrade
    alone (a fix never names a config key the job's version does not have)."""
    if not cfg.deepspeed_at_least("0.14.3"):
        return {"upgrade": "deepspeed>=0.14.3"}
    return {"config": {"timers.throughput.synchronized": False}}


def _hpz_fix(cfg: SimConfig) -> dict[str, Any]:
    """hpZ gathers on an intra-node group of `zero_hpz_partition_size` ranks (DeepSpeed `groups.
    _create_zero_param_parallel_group`, `stage3.py` `zero_param_parallel_group`), separate from the reduce-scatter
    communicator. With 1 GPU per node the secondary group would be each rank alone (size 1 = hpZ off): no config
    change separates the communicators, only building the engine without the mpu's data-parallel group."""
    if cfg.gpus_per_node < 2:
        return {}
    return {"config": {"zero_optimization.zero_hpz_partition_size": cfg.gpus_per_node}}


def _node_ranks(cfg: SimConfig, node: int | None) -> list[int]:
    """The ranks of `node` (none without one)."""
    if node is None:
        return []
    return list(range(node * cfg.gpus_per_node, (node + 1) * cfg.gpus_per_node))


def _bandwidth_fix(cfg: SimConfig) -> dict[str, Any]:
    """Fewer bytes (ZeRO++ quantized weights and gradients, hpZ gathers inside the node when the job has several
    nodes of several GPUs), more compute per byte (twice the micro-batch), bf16 communication instead of fp32.
    The network itself is what the counterfactual heals; no config key does."""
    config: dict[str, Any] = {
        "zero_optimization.zero_quantized_weights": True,
        "zero_optimization.zero_quantized_gradients": True,
    }
    if cfg.gpus_per_node > 1 and cfg.nodes > 1:
        config["zero_optimization.zero_hpz_partition_size"] = cfg.gpus_per_node
    config["train_micro_batch_size_per_gpu"] = cfg.model.micro_batch * 2
    if cfg.communication_data_type == "fp32":
        config["communication_data_type"] = "bf16"
    return {"config": config}


CAUSES: dict[str, Cause] = {
    "reduce-scatter-deferred": Cause(
        lambda cfg: {"reduce_bucket_size": 50_000_000},
        lambda cfg: {"config": {"zero_optimization.reduce_bucket_size": 50_000_000}},
    ),
    "throughput-timer-sync": Cause(lambda cfg: {"throughput_timer_sync": False}, _timer_fix),
    "overlap-comm-disabled": Cause(
        lambda cfg: {"overlap_comm": True}, lambda cfg: {"config": {"zero_optimization.overlap_comm": True}}
    ),
    "comms-logger-sync": Cause(
        lambda cfg: {"comms_logger": False}, lambda cfg: {"config": {"comms_logger.enabled": False}}
    ),
    "same-communicator": Cause(lambda cfg: {"same_communicator": False}, _hpz_fix),
    "no-stream-concurrency": Cause(
        lambda cfg: {"max_connections_1": False}, lambda cfg: {"env": {"CUDA_DEVICE_MAX_CONNECTIONS": None}}
    ),
    "straggler": Cause(
        lambda cfg: {"straggler_rank": None, "straggler_factor": 1.0},
        lambda cfg: {},
        lambda cfg: [cfg.straggler_rank] if cfg.straggler_rank is not None else [],
    ),
    "offload-blocking-copy": Cause(
        lambda cfg: {"deepspeed_version": "0.19.5", "offload_pin_memory": True},
        lambda cfg: {
            "upgrade": "deepspeed>=0.19.5",
            "config": {"zero_optimization.offload_optimizer.pin_memory": True},
        },
    ),
    "reduce-event-throttle": Cause(
        lambda cfg: {"reduce_event_throttle": False},
        lambda cfg: {"config": {"zero_optimization.reduce_bucket_size": min(cfg.reduce_bucket_size * 5, 500_000_000)}},
    ),
    "epilogue-sync": Cause(lambda cfg: {"epilogue_sync": False}, lambda cfg: {}),
    "fetch-throttle": Cause(lambda cfg: {"fetch_event_throttle": False}, lambda cfg: {}),
    "bandwidth-bound": Cause(lambda cfg: {"comm_slowdown": 1.0}, _bandwidth_fix),
    "gpu-straggler": Cause(
        lambda cfg: {"straggler_rank": None, "straggler_factor": 1.0, "straggler_scope": "all"},
        lambda cfg: {},
        lambda cfg: [cfg.straggler_rank] if cfg.straggler_rank is not None else [],
        rule="straggler",
        extra=lambda cfg: {"late_on": "gpu"},
    ),
    "host-straggler": Cause(
        lambda cfg: {"host_delay_rank": None, "host_delay_us": 0.0},
        lambda cfg: {},
        lambda cfg: [cfg.host_delay_rank] if cfg.host_delay_rank is not None else [],
        rule="straggler",
        extra=lambda cfg: {"late_on": "host", "frames": list(DATALOADER_FRAMES)},
    ),
    "slow-node": Cause(
        lambda cfg: {"slow_node": None, "straggler_factor": 1.0},
        lambda cfg: {},
        lambda cfg: _node_ranks(cfg, cfg.slow_node),
        extra=lambda cfg: {"late_on": "gpu"},
    ),
    "user-wait-stream": Cause(
        lambda cfg: {"user_wait_stream": False},
        lambda cfg: {},
        rule="cross-stream-wait",
        extra=lambda cfg: {"call_site": USER_GRAD_HOOK},
    ),
    "fp32-communication": Cause(
        lambda cfg: {"communication_data_type": "bf16"},
        lambda cfg: {"config": {"communication_data_type": "bf16"}},
    ),
    "offload-param-copy": Cause(
        lambda cfg: {"offload_param_pin_memory": True},
        lambda cfg: {"config": {"zero_optimization.offload_param.pin_memory": True}},
    ),
    "allgather-not-prefetched": Cause(
        lambda cfg: {"prefetch_bucket_size": 50_000_000},
        lambda cfg: {"config": {"zero_optimization.stage3_prefetch_bucket_size": 50_000_000}},
    ),
}

# DeepSpeed behaviours present in every simulated job; truth.json measures them the same way ("inherent")
INHERENT = ("epilogue-sync", "reduce-event-throttle", "fetch-throttle")

NCCL_FOR_TORCH = [
    ("2.8", "2.27.3"),
    ("2.7", "2.26.2"),
    ("2.5", "2.21.5"),
    ("2.3", "2.20.5"),
    ("2.2", "2.19.3"),
    ("2.1", "2.18.1"),
    ("0", "2.14.3"),
]


def _same_effect(a: str, b: str) -> bool:
    """Whether CAUSES keys a and b plant the same rule through the same config fields (`straggler` and
    `gpu-straggler`): combining their presets keeps one effect, the later preset's."""
    ca, cb = CAUSES[a], CAUSES[b]
    fa, fb = set(ca.counterfactual(SimConfig())), set(cb.counterfactual(SimConfig()))
    return a != b and (ca.rule or a) == (cb.rule or b) and (fa <= fb or fb <= fa)


MAX_RANK_STEPS = 8192  # world size x steps: ~1.5 MB of memory each (measured: 16 ranks x 5 steps, 118 MB)


def parse_scenario(name: str) -> list[str]:
    """The presets of `a+b+...`; a UserError for an unknown one or an empty part (`healthy+`, `a++b`)."""
    parts = [p.strip() for p in name.split("+")]
    if any(not p for p in parts):
        raise UserError(f"scenario {name!r} has an empty part: presets are joined by single '+'s")
    unknown = [p for p in parts if p not in PRESETS]
    if unknown:
        raise UserError(f"unknown scenario {', '.join(unknown) or repr(name)}; presets: {', '.join(sorted(PRESETS))}")
    return parts


def build_config(name: str, **options: Any) -> tuple[SimConfig, list[str]]:
    """The config of scenario `name` (`a+b` applies a then b) with CLI options; and its causes."""
    from overlapcheck.simulate.config import DS013_VERSIONS, LAYOUTS, version_tuple

    parts = parse_scenario(name)
    overrides: dict[str, Any] = dict(BASE)
    causes: list[str] = []
    for part in parts:
        preset = PRESETS[part]
        overrides.update(preset.overrides)
        keys = [preset.variants.get(rule, rule) for rule in preset.causes]
        # an effect planted again by a later preset (same rule, same config fields) is planted once, as the later
        same = [c for c in causes if any(_same_effect(c, k) for k in keys)]
        causes = [c for c in causes if c not in same]
        causes += [k for k in keys if k not in causes]
    given = {k: v for k, v in options.items() if v is not None}
    for key in ("torch_version", "nccl_version", "deepspeed_version"):
        if key in given and not version_tuple(str(given[key])):
            raise UserError(f"--{key.replace('_', '-')} {given[key]!r} is not a version like 2.4.0")
    if given.get("layout", "default") not in LAYOUTS:
        raise UserError(f"unknown --layout {given['layout']!r}; choose {' or '.join(LAYOUTS)}")
    if given.get("layout") == "ds013":  # that stack's versions, unless given
        given = {**DS013_VERSIONS, **given}
    if "torch_version" in given and "nccl_version" not in given:
        torch = version_tuple(given["torch_version"])
        given["nccl_version"] = next(n for t, n in NCCL_FOR_TORCH if torch >= version_tuple(t))
    overrides.update(given)
    skew = overrides.pop("clock_skew_us", 0.0)
    cfg = SimConfig(scenario=name, model=ModelSpec()).with_overrides(overrides)
    if cfg.nodes < 1 or cfg.gpus_per_node < 1 or cfg.steps < 1:
        raise UserError("--nodes, --gpus-per-node and --steps must be at least 1")
    if cfg.world_size * cfg.steps > MAX_RANK_STEPS:
        raise UserError(
            f"--nodes x --gpus-per-node x --steps is {cfg.world_size:,} ranks x {cfg.steps:,} steps: more than the "
            f"{MAX_RANK_STEPS:,} rank-steps one simulation holds in memory (about 1.5 MB each, all ranks are kept "
            "until they are written)"
        )
    if cfg.gpu not in ("A100", "H100"):
        raise UserError(f"unknown --gpu {cfg.gpu!r}; choose A100 or H100")
    for key in ("straggler_rank", "host_delay_rank"):  # -k: the rank seed + k - 1 (mod world size)
        chosen = getattr(cfg, key)
        if chosen is not None and chosen < 0:
            cfg = cfg.with_overrides({key: (cfg.seed - chosen - 1) % cfg.world_size if cfg.world_size > 1 else 0})
    if cfg.slow_node is not None and cfg.slow_node < 0:  # -k: the node seed + k - 1 (mod nodes)
        cfg = cfg.with_overrides({"slow_node": (cfg.seed - cfg.slow_node - 1) % cfg.nodes})
    if skew:
        offsets = tuple(
            0.0 if n == 0 else round(skew * (jitter(cfg.seed, "clock", n, spread=1.0) - 1.0), 3)
            for n in range(cfg.nodes)
        )
        cfg = cfg.with_overrides({"clock_offset_us": offsets})
    if "reduce-scatter-deferred" in causes and cfg.reduce_bucket_size < cfg.model.parameters:
        causes.remove("reduce-scatter-deferred")  # the override made the bucket small again
    return cfg, causes
