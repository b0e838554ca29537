"""The simulated job: cluster, software versions, model, DeepSpeed ZeRO-3 settings and planted effects."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any


@cache  # called for every simulated kernel (SimConfig.*_at_least)
def version_tuple(version: str) -> tuple[int, ...]:
    """'2.13.0' -> (2, 13, 0); trailing non-digits ('2.1.0+cu121') are ignored."""
    out = []
    for part in version.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


@dataclass(frozen=True)
class ModelSpec:
    """A GPT-like decoder: an embedding and `layers` transformer blocks (tied output head)."""

    hidden: int = 2048
    layers: int = 8
    vocab: int = 32000
    seq_len: int = 4096
    micro_batch: int = 2

    @property
    def tokens(self) -> int:
        return self.seq_len * self.micro_batch

    def block_tensors(self) -> list[tuple[str, int]]:
        """The large parameter tensors of one block (name, numel); small ones are persistent."""
        h = self.hidden
        return [
            ("attn.qkv.weight", 3 * h * h),
            ("attn.proj.weight", h * h),
            ("mlp.fc1.weight", 4 * h * h),
            ("mlp.fc2.weight", 4 * h * h),
        ]

    @property
    def block_params(self) -> int:
        return sum(n for _, n in self.block_tensors())

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def parameters(self) -> int:
        return self.embed_params + self.layers * self.block_params


LATE_FIELDS = (
    "straggler_scope",
    "slow_node",
    "env_recorded",
    "host_delay_rank",
    "host_delay_us",
    "user_wait_stream",
    "backward_host_us",
    "layout",
    "offload_param",
    "offload_param_pin_memory",
    "module_frames",
)
# how the trace files are written (docs/simulator.md, Layouts): "default" follows the versions' own switches;
# "ds013" writes what DeepSpeed 0.13.3 + torch 1.13.1 + NCCL 2.14 wrote (DS #5201's stack)
LAYOUTS = ("default", "ds013")
DS013_VERSIONS = {"torch_version": "1.13.1", "deepspeed_version": "0.13.3", "nccl_version": "2.14.3"}


@dataclass(frozen=True)
class SimConfig:
    """Everything that determines a simulated trace set; `dataclasses.replace` makes counterfactuals."""

    scenario: str = "healthy"
    nodes: int = 2
    gpus_per_node: int = 8
    gpu: str = "H100"
    seed: int = 0
    steps: int = 2
    first_step: int = 5
    torch_version: str = "2.13.0"
    deepspeed_version: str = "0.19.8"
    nccl_version: str = "2.27.3"
    model: ModelSpec = field(default_factory=ModelSpec)
    # DeepSpeed zero_optimization (element counts, like the config file)
    overlap_comm: bool = True
    reduce_bucket_size: int = 50_000_000
    prefetch_bucket_size: int = 50_000_000
    max_live_parameters: int = 1_000_000_000
    communication_data_type: str = "bf16"
    offload_optimizer: bool = False
    offload_pin_memory: bool = False
    same_communicator: bool = False
    trace_invalidated: bool = False  # parameter trace cache invalid: no prefetch
    # DeepSpeed behaviours that counterfactuals switch off
    reduce_event_throttle: bool = True
    fetch_event_throttle: bool = True
    epilogue_sync: bool = True  # reduce_and_partition_stream.synchronize() at the end of backward
    comms_logger: bool = False
    throughput_timer_sync: bool = False
    # environment and hardware effects
    max_connections_1: bool = False
    straggler_rank: int | None = None
    straggler_factor: float = 1.0
    clock_offset_us: tuple[float, ...] = ()  # per node, applied only when writing ts
    comm_slowdown: float = 1.0  # divides the network bandwidth (congested fabric)
    free_collectives: tuple[str, ...] = ()  # counterfactual: these collectives take no time
    # fields added after the first sample sets; truth.json lists them only when they differ from the default
    straggler_scope: str = "all"  # "math": only GEMM and attention kernels slow down (SM clocks), HBM-bound not
    slow_node: int | None = None  # every GPU of this node runs straggler_factor slower (a throttled node)
    env_recorded: bool = True  # the job description carries env() (False: traces copied off a cluster alone)
    host_delay_rank: int | None = None  # this rank's host spends host_delay_us in the data loader every step
    host_delay_us: float = 0.0
    user_wait_stream: bool = False  # a user grad hook: current_stream().wait_stream(reduce stream) per gradient
    backward_host_us: float = 0.0  # extra Python time per hooked module in backward (deep module trees)
    # nn.Module frames in the forward pass and the module annotations of `overlapcheck run` (capture/modules.py),
    # at no host cost (the timeline is that of the set without them), with the per-module truth
    module_frames: bool = False
    layout: str = "default"  # one of LAYOUTS
    offload_param: bool = False  # zero_optimization.offload_param to CPU: each gather copies its shard to the GPU
    offload_param_pin_memory: bool = False  # its pin_memory: pinned copies run asynchronously

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def torch_at_least(self, version: str) -> bool:
        return version_tuple(self.torch_version) >= version_tuple(version)

    def deepspeed_at_least(self, version: str) -> bool:
        return version_tuple(self.deepspeed_version) >= version_tuple(version)

    def nccl_at_least(self, version: str) -> bool:
        return version_tuple(self.nccl_version) >= version_tuple(version)

    def with_overrides(self, overrides: dict[str, Any]) -> SimConfig:
        """A copy with fields replaced; `model.<field>` keys replace model fields."""
        model_over = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith("model.")}
        plain = {k: v for k, v in overrides.items() if not k.startswith("model.")}
        cfg = replace(self, **plain)
        if model_over:
            cfg = replace(cfg, model=replace(cfg.model, **model_over))
        return cfg

    def ds_config(self) -> dict[str, Any]:
        """The DeepSpeed config this job would have used (what `ds_config.json` holds)."""
        zero: dict[str, Any] = {
            "stage": 3,
            "overlap_comm": self.overlap_comm,
            "contiguous_gradients": True,
            "reduce_scatter": True,
            "reduce_bucket_size": self.reduce_bucket_size,
            "stage3_prefetch_bucket_size": self.prefetch_bucket_size,
            "stage3_max_live_parameters": self.max_live_parameters,
            "stage3_param_persistence_threshold": 100_000,
        }
        if self.offload_optimizer:
            zero["offload_optimizer"] = {"device": "cpu", "pin_memory": self.offload_pin_memory}
        if self.offload_param:
            zero["offload_param"] = {"device": "cpu", "pin_memory": self.offload_param_pin_memory}
        cfg: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": self.model.micro_batch,
            "train_batch_size": self.model.micro_batch * self.world_size,
            "gradient_clipping": 1.0,
            "steps_per_print": 1,
            "bf16": {"enabled": True},
            "zero_optimization": zero,
        }
        if self.communication_data_type == "fp32":
            cfg["communication_data_type"] = "fp32"
        if self.comms_logger:
            cfg["comms_logger"] = {"enabled": True, "verbose": False, "prof_all": True}
        if self.deepspeed_at_least("0.14.3"):
            cfg["timers"] = {"throughput": {"enabled": True, "synchronized": self.throughput_timer_sync}}
        return cfg

    def env(self) -> dict[str, str]:
        """Environment variables of the job that matter to overlap."""
        return {"CUDA_DEVICE_MAX_CONNECTIONS": "1"} if self.max_connections_1 else {}
