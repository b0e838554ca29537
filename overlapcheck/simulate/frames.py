"""DeepSpeed/PyTorch call stacks as `with_stack=True` records them (`python_function` events).

Only the frames that matter for diagnosis are kept (a real stack has 2-3x more, e.g. nvtx wrappers and
c10d_logger), so that the sample traces stay small.

Names and first lines are those of DeepSpeed 0.19.8 (the installed source, and the CPU ZeRO-3 trace in
../shared/traces/cpu-zero3-gloo). For DeepSpeed < 0.14 the functions named in
knowledge/zero3-overlap.md use their v0.13.3 lines (fetch_sub_module 261, __add_grad_to_ipg_bucket 1230,
__reduce_and_partition_ipg_grads 1249, independent_gradient_partition_epilogue 1082, partition_grads
1418, timed_op 121); the others keep their 0.19.8 lines.

The ds013 layout (DeepSpeed 0.13.3 on torch 1.13.1) also writes that stack's shape of the frames: 0.13.3's
fetch_sub_module is one function (no _fetch_sub_module_impl, added later), reduce_independent_p_g_buckets_and_
remove_grads starts at line 1213, torch 1.13 has no torch/utils/_contextlib.py (no_grad's decorate_context is in
torch/autograd/grad_mode.py) and no torch/autograd/graph.py _engine_run_backward (backward calls
Variable._execution_engine.run_backward directly). docs/simulator.md lists which lines were checked.
"""

from __future__ import annotations

from overlapcheck.simulate.config import SimConfig

_NEW = {
    "fetch": 307,
    "fetch_impl": 353,
    "add_grad": 1619,
    "reduce_ipg": 1646,
    "epilogue": 1406,
    "partition_grads": 2005,
    "log_wrapper": 111,
}
_OLD = {
    "fetch": 261,
    "fetch_impl": 261,
    "add_grad": 1230,
    "reduce_ipg": 1249,
    "epilogue": 1082,
    "partition_grads": 1418,
    "log_wrapper": 121,
}

# a data loader the host waits for (host-straggler) and a user gradient hook (user-wait-stream), torch 2.x lines
DATALOADER_FRAMES = (
    "torch/utils/data/dataloader.py(628): __next__",
    "torch/utils/data/dataloader.py(1329): _next_data",
)
USER_GRAD_HOOK = "train.py(57): grad_hook"
WAIT_STREAM = "torch/cuda/streams.py(65): wait_stream"

NVTX = "deepspeed/utils/nvtx.py(30): wrapped_fn"
CTX = "torch/utils/_contextlib.py(120): decorate_context"
CTX_113 = "torch/autograd/grad_mode.py(27): decorate_context"  # torch 1.13: no torch/utils/_contextlib.py
Z = "deepspeed/runtime/zero/"


class Frames:
    """The frame names for one DeepSpeed version."""

    def __init__(self, cfg: SimConfig):
        self.line = _NEW if cfg.deepspeed_at_least("0.14") else _OLD
        self.ds013 = cfg.layout == "ds013"
        self.ctx = CTX_113 if self.ds013 else CTX

    def train_step(self) -> tuple[str, ...]:
        return ("train.py(112): <module>", "train.py(100): main", "train.py(77): step")

    def dataloader(self) -> tuple[str, ...]:
        return DATALOADER_FRAMES

    def user_grad_hook(self) -> tuple[str, ...]:
        """`p.register_post_accumulate_grad_hook(grad_hook)` in train.py; it runs inside AccumulateGrad on the
        autograd thread, after DeepSpeed's hook, and calls `current_stream().wait_stream(reduce_stream)`."""
        return (USER_GRAD_HOOK, WAIT_STREAM)

    def engine_forward(self) -> tuple[str, ...]:
        if self.ds013:
            return ("torch/nn/modules/module.py(1190): _call_impl", "deepspeed/runtime/engine.py(2982): forward")
        return ("torch/nn/modules/module.py(1782): _call_impl", "deepspeed/runtime/engine.py(2982): forward")

    def pre_forward_hook(self) -> tuple[str, ...]:
        return (f"{Z}parameter_offload.py(358): _pre_forward_module_hook",)

    def pre_backward_hook(self) -> tuple[str, ...]:
        return (f"{Z}parameter_offload.py(455): _run_before_backward_function",)

    def fetch(self) -> tuple[str, ...]:
        if self.ds013:  # one function in 0.13.3, decorated with @instrument_w_nvtx and @torch.no_grad()
            return (NVTX, self.ctx, f"{Z}partitioned_param_coordinator.py({self.line['fetch']}): fetch_sub_module")
        return (
            NVTX,
            f"{Z}partitioned_param_coordinator.py({self.line['fetch']}): fetch_sub_module",
            f"{Z}partitioned_param_coordinator.py({self.line['fetch_impl']}): _fetch_sub_module_impl",
        )

    def offload_copy(self) -> tuple[str, ...]:
        """partition_parameters.py `_all_gather_dtype`: `p.ds_tensor.to(device)` for each offloaded shard."""
        return (
            f"{Z}partitioned_param_coordinator.py(568): __all_gather_params",
            f"{Z}partition_parameters.py(1539): all_gather_coalesced",
            f"{Z}partition_parameters.py(1360): _all_gather_dtype",
        )

    def all_gather(self) -> tuple[str, ...]:
        return (
            f"{Z}partitioned_param_coordinator.py(568): __all_gather_params",
            f"{Z}partition_parameters.py(1539): all_gather_coalesced",
            "deepspeed/comm/comm.py(352): allgather_fn",
        )

    def all_gather_tail(self) -> tuple[str, ...]:
        return (
            "deepspeed/comm/comm.py(333): all_gather_into_tensor",
            "torch/distributed/distributed_c10d.py(4398): all_gather_into_tensor",
        )

    def handle_wait(self) -> tuple[str, ...]:
        return (f"{Z}partition_parameters.py(818): wait", f"{Z}partition_parameters.py(760): wait")

    def log_wrapper(self) -> str:
        return f"deepspeed/comm/comm.py({self.line['log_wrapper']}): log_wrapper"

    def grad_hook(self) -> tuple[str, ...]:
        return (
            f"{Z}stage3.py(1508): reduce_partition_and_remove_grads",
            f"{Z}stage3.py({1213 if self.ds013 else 1569}): reduce_independent_p_g_buckets_and_remove_grads",
        )

    def add_grad(self) -> tuple[str, ...]:
        return (f"{Z}stage3.py({self.line['add_grad']}): __add_grad_to_ipg_bucket",)

    def reduce_ipg(self) -> tuple[str, ...]:
        return (NVTX, self.ctx, f"{Z}stage3.py({self.line['reduce_ipg']}): __reduce_and_partition_ipg_grads")

    def reduce_scatter(self) -> tuple[str, ...]:
        return (
            f"{Z}stage3.py(1911): __avg_scatter_grads",
            "deepspeed/runtime/comm/coalesced_collectives.py(79): reduce_scatter_coalesced",
            "deepspeed/comm/comm.py(283): reduce_scatter_fn",
        )

    def reduce_scatter_tail(self) -> tuple[str, ...]:
        return (
            "deepspeed/comm/comm.py(316): reduce_scatter_tensor",
            "torch/distributed/distributed_c10d.py(4947): reduce_scatter_tensor",
        )

    def partition_grads(self) -> tuple[str, ...]:
        return (f"{Z}stage3.py({self.line['partition_grads']}): partition_grads",)

    def backward(self) -> tuple[str, ...]:
        return ("deepspeed/runtime/engine.py(3381): backward",)

    def loss_backward(self) -> tuple[str, ...]:
        if self.ds013:  # torch 1.13: run_backward is called from torch/autograd/__init__.py itself
            return ("torch/_tensor.py(487): backward", "torch/autograd/__init__.py(197): backward")
        return (
            "torch/_tensor.py(566): backward",
            "torch/autograd/__init__.py(255): backward",
            "torch/autograd/graph.py(966): _engine_run_backward",
        )

    def epilogue(self) -> tuple[str, ...]:
        return (
            "deepspeed/runtime/engine.py(3153): _backward_epilogue",
            "deepspeed/runtime/engine.py(3072): allreduce_gradients",
            f"{Z}stage3.py(1484): overlapping_partition_gradients_reduce_epilogue",
            f"{Z}stage3.py({self.line['epilogue']}): independent_gradient_partition_epilogue",
        )

    def step(self) -> tuple[str, ...]:
        return (
            "deepspeed/runtime/engine.py(3567): step",
            "deepspeed/runtime/engine.py(3505): _take_model_step",
            f"{Z}stage3.py(2872): step",
        )

    def grad_norm(self) -> tuple[str, ...]:
        return (f"{Z}stage3.py(2572): _get_norm_groups", f"{Z}stage3.py(2418): get_grad_norm_direct")

    def all_reduce(self) -> tuple[str, ...]:
        return ("deepspeed/comm/comm.py(696): all_reduce", "torch/distributed/distributed_c10d.py(3155): all_reduce")

    def timer(self, which: str) -> tuple[str, ...]:
        line = 231 if which == "start" else 246
        return (f"deepspeed/utils/timer.py({line}): {which}", *self.accelerator_sync())

    def accelerator_sync(self) -> tuple[str, ...]:
        return (
            "deepspeed/accelerator/cuda_accelerator.py(88): synchronize",
            "torch/cuda/__init__.py(1209): synchronize",
        )
