"""One rank's ZeRO-3 training step, in DeepSpeed's order of operations.

Sources (installed DeepSpeed 0.19.8; v0.13.3 lines in knowledge/zero3-overlap.md):
- forward/backward fetch: `partitioned_param_coordinator.py` `fetch_sub_module` / `_fetch_sub_module_impl`
  (all-gather on `__allgather_stream`, async on the PG stream; the fetch-event throttle
  `__ongoing_fetch_events.popleft().synchronize()` when more than `__max_ongoing_fetch_events = 2` are
  in flight; `handle.wait()`, whose `torch.cat` per parameter runs on the all-gather stream;
  `current_stream().wait_stream(__allgather_stream)`; prefetch of the next modules up to
  `stage3_prefetch_bucket_size` when the trace is complete).
- gradient hook: `stage3.py` `reduce_independent_p_g_buckets_and_remove_grads` (flush when
  `elements + numel > reduce_bucket_size`), `__add_grad_to_ipg_bucket` (`reduce_and_partition_stream
  .wait_stream(current_stream)`, copy into the flat buffer on the reduce stream).
- flush: `__reduce_and_partition_ipg_grads` (drain `param_reduce_events` with `query()`, then
  `popleft().synchronize()` when more than `max_param_reduce_events = 2` remain; `__avg_scatter_grads`
  -> `reduce_scatter_coalesced` (cat, pre-divide, one synchronous `reduce_scatter_tensor`);
  `partition_grads`; `event.record()`).
- epilogue: `independent_gradient_partition_epilogue` flushes the last bucket and calls
  `reduce_and_partition_stream.synchronize()`.
- `overlap_comm: false` makes both side streams the default stream (`stage3.py`, `parameter_offload.py`).
- `comm.py` `timed_op`/`log_wrapper`: `get_accelerator().synchronize()` after every collective when the
  comms logger is on; `utils/timer.py` ThroughputTimer: device synchronize at start and stop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator
from contextlib import AbstractContextManager, ExitStack, nullcontext

from overlapcheck.simulate.collectives import DTYPE_BYTES, Fabric, ProcessGroup, launch_collective
from overlapcheck.simulate.config import SimConfig
from overlapcheck.simulate.engine import Event, GpuOp
from overlapcheck.simulate.frames import Frames
from overlapcheck.simulate.hardware import GPUS, attention_us, gemm_us, host_copy_us, jitter, memory_us
from overlapcheck.simulate.host import Host
from overlapcheck.simulate.kernels import ELEMENTWISE, flash_name, gemm_name, launch_args

COMPUTE, AG_STREAM, REDUCE_STREAM = 7, 13, 17
MAX_ONGOING = 2  # __max_ongoing_fetch_events and max_param_reduce_events

Step = Generator[GpuOp, None, None]


def process_groups(cfg: SimConfig) -> tuple[ProcessGroup, ProcessGroup, ProcessGroup]:
    """(all-gather group, reduce-scatter group, world group) and their NCCL streams.

    zero.Init all-gathers on the world group; the optimizer reduces on `groups._clone_world_group()`;
    with a Megatron mpu both use the data-parallel group (one communicator).
    """
    ranks = tuple(range(cfg.world_size))
    world = ProcessGroup("0", "default_pg", ranks, 21)
    if cfg.same_communicator:
        dp = ProcessGroup("2", "data_parallel", ranks, 29)
        return dp, dp, world
    return world, ProcessGroup("1", "undefined", ranks, 25), world


class RankStep:
    """The host program of one rank; `steps()` is the generator the engine runs."""

    def __init__(self, cfg: SimConfig, host: Host, fabric: Fabric):
        self.cfg = cfg
        self.host = host
        self.fabric = fabric
        self.gpu = GPUS[cfg.gpu]
        self.fr = Frames(cfg)
        self.m = cfg.model
        self.ag_pg, self.rs_pg, self.world = process_groups(cfg)
        self.ag_stream = AG_STREAM if cfg.overlap_comm else COMPUTE
        self.reduce_stream = REDUCE_STREAM if cfg.overlap_comm else COMPUTE
        on_slow_node = cfg.slow_node is not None and host.rank // cfg.gpus_per_node == cfg.slow_node
        self.slow = cfg.straggler_factor if cfg.straggler_rank == host.rank or on_slow_node else 1.0
        self.seq: dict[str, int] = {}
        self.modules = [[("embed.weight", self.m.embed_params)]] + [
            [(f"layers.{i}.{n}", k) for n, k in self.m.block_tensors()] for i in range(self.m.layers)
        ]
        self.inflight: dict[int, GpuOp] = {}
        self.available: set[int] = set()
        self.fetch_events: deque[Event] = deque()
        self.reduce_events: deque[Event] = deque()
        self.bucket: list[tuple[str, int]] = []
        self.step_no = 0
        self.autograd_seq = 0

    # -- helpers ----------------------------------------------------------------------------
    def _path(self, module: int) -> str:
        """A module's path in the model (`named_modules`): the embedding, then the blocks."""
        return "embed" if module == 0 else f"layers.{module - 1}"

    def _label(self, module: int) -> str:
        """`<path> (<class>)`, as the capture's annotations name a module (capture/modules.py)."""
        return f"{self._path(module)} ({'Embedding' if module == 0 else 'Block'})"

    def _module_of(self, param: str) -> int:
        return 0 if param.startswith("embed.") else int(param.split(".")[1]) + 1

    def _mark(self, cat: str, *names: str) -> AbstractContextManager[None]:
        """Module frames and annotations (cfg.module_frames), at no host cost; nothing otherwise."""
        return self.host.marks(cat, *names) if self.cfg.module_frames else nullcontext()

    def _numel(self, module: int) -> int:
        return sum(n for _, n in self.modules[module])

    def _next_seq(self, pg: ProcessGroup) -> int:
        self.seq[pg.name] = self.seq.get(pg.name, 0) + 1
        return self.seq[pg.name]

    def kernel(
        self,
        op_name: str,
        name: str,
        us: float,
        family: str = "elementwise",
        stream: int = COMPUTE,
        compute_bound: bool = True,
    ) -> GpuOp:
        """An aten op launching one compute kernel (slowed on a straggler's GPU)."""
        scale = self.slow if compute_bound else 1.0
        if scale != 1.0 and self.cfg.straggler_scope == "math" and family not in ("gemm", "flash"):
            scale = 1.0  # SM clocks throttled: HBM-bound kernels keep their speed
        dur = us * scale * jitter(self.cfg.seed, self.host.rank, self.step_no, op_name, us)
        with self.host.cpu_op(op_name, cost=8.0):
            return self.host.launch(name, stream, dur, args=launch_args(family, self.gpu.sms))

    def gemm(self, m: int, n: int, k: int, transposed: bool = True) -> GpuOp:
        return self.kernel("aten::mm", gemm_name(self.cfg, transposed), gemm_us(self.gpu, m, n, k), "gemm")

    def elementwise(self, op_name: str, which: str, nbytes: float, stream: int = COMPUTE) -> GpuOp:
        return self.kernel(op_name, ELEMENTWISE[which], memory_us(self.gpu, nbytes), stream=stream)

    def memcpy(self, name: str, nbytes: int, stream: int, us: float) -> GpuOp:
        with self.host.cpu_op("aten::copy_", cost=6.0):
            return self.host.launch(
                name,
                stream,
                us,
                kind="memcpy",
                cls="memcpy",
                args={"bytes": nbytes, "memory bandwidth (GB/s)": nbytes / (us * 1e3)},
            )

    def collective(
        self,
        kind: str,
        pg: ProcessGroup,
        numel: int,
        dtype: str,
        stream: int,
        async_op: bool,
        frames: tuple[str, ...],
        tail: tuple[str, ...],
    ) -> Generator[GpuOp, None, GpuOp]:
        """A DeepSpeed comm call: its python frames, the c10d launch, and the comms-logger sync."""
        with self.host.frames(*frames, self.fr.log_wrapper()):
            with self.host.frames(*tail):
                op = launch_collective(
                    self.host, self.fabric, pg, self._next_seq(pg), kind, numel, dtype, stream, async_op
                )
            if self.cfg.comms_logger:
                with self.host.frames(*self.fr.accelerator_sync()):
                    yield from self.host.synchronize_device()
        return op

    # -- parameter fetch (partitioned_param_coordinator.py) ----------------------------------
    def _all_gather(self, module: int) -> Step:
        numel = self._numel(module) // self.cfg.world_size
        if self.cfg.offload_param:
            yield from self._offload_copy(numel)
        params = "overlapcheck.params: " + self._label(module)  # __all_gather_params, as the capture wraps it
        with self.host.frames(*self.fr.all_gather()), self._mark("user_annotation", params):
            self.host.spend(60.0 + 15.0 * len(self.modules[module]), "allgather-prep")
            op = yield from self.collective(
                "all_gather", self.ag_pg, numel, "bf16", self.ag_stream, True, (), self.fr.all_gather_tail()
            )
        op.modules = (self._path(module),)
        self.inflight[module] = op

    def _offload_copy(self, numel: int) -> Step:
        """offload_param: the shard's `ds_tensor.to(device)` on the all-gather stream (torch copy_ with
        non_blocking=False: from pageable memory the call returns once the staged copy is done; from pinned
        memory it is asynchronous here, an assumption: DeepSpeed then synchronizes only through the gather's
        handle)."""
        host, pinned = self.host, self.cfg.offload_param_pin_memory
        nbytes = numel * 2
        us = host_copy_us(nbytes, pinned)
        name = f"Memcpy HtoD ({'Pinned' if pinned else 'Pageable'} -> Device)"
        args = {"bytes": nbytes, "memory bandwidth (GB/s)": nbytes / (us * 1e3)}
        with host.frames(*self.fr.offload_copy()), host.cpu_op("aten::to", cost=6.0), host.cpu_op("aten::copy_"):
            if pinned:
                host.launch(name, self.ag_stream, us, kind="memcpy", cls="memcpy", args=args)
            else:
                yield from host.blocking_copy(name, self.ag_stream, us, args)

    def fetch(self, module: int, order: list[int]) -> Step:
        host = self.host
        fetch = "overlapcheck.module: " + self._label(module)  # fetch_sub_module, as the capture wraps it
        with host.frames(*self.fr.fetch()), self._mark("user_annotation", fetch):
            host.spend(120.0 + 20.0 * len(self.modules[module]), "fetch")  # coordinator bookkeeping
            if module not in self.available and module not in self.inflight:
                yield from self._all_gather(module)
            if module in self.inflight:
                op = self.inflight.pop(module)
                while self.fetch_events:
                    done = yield from host.query(self.fetch_events[0])
                    if not done:
                        break
                    self.fetch_events.popleft()
                if self.cfg.fetch_event_throttle and len(self.fetch_events) > MAX_ONGOING:
                    yield from host.synchronize_event(self.fetch_events.popleft())
                with host.frames(*self.fr.handle_wait()):
                    if op.stream != self.ag_stream:
                        host.wait_stream(self.ag_stream, op.stream)
                    for _, numel in self.modules[module]:  # param.data = torch.cat(partitions), per param
                        self.elementwise("aten::cat", "cat", numel * 4, self.ag_stream)
                self.fetch_events.append(host.record(self.ag_stream))
                self.available.add(module)
            host.wait_stream(COMPUTE, self.ag_stream)
            if not self.cfg.trace_invalidated:
                budget = 0
                for nxt in order[order.index(module) + 1 :]:
                    if budget >= self.cfg.prefetch_bucket_size:
                        break
                    if nxt not in self.available and nxt not in self.inflight:
                        yield from self._all_gather(nxt)
                    budget += self._numel(nxt)

    # -- gradient reduction (stage3.py) ------------------------------------------------------
    def grad_ready(self, name: str, numel: int) -> Step:
        """The AccumulateGrad hook of one parameter."""
        host = self.host
        with host.cpu_op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", cost=4.0):
            hook = "overlapcheck.grad: " + self._label(self._module_of(name))
            with host.frames(*self.fr.grad_hook()), self._mark("user_annotation", hook):
                host.spend(50.0, "grad-hook")
                if self.bucket and sum(n for _, n in self.bucket) + numel > self.cfg.reduce_bucket_size:
                    yield from self.flush()
                with host.frames(*self.fr.add_grad()):
                    host.wait_stream(self.reduce_stream, COMPUTE)
                    nbytes = numel * 2
                    self.memcpy(
                        "Memcpy DtoD (Device -> Device)", nbytes, self.reduce_stream, memory_us(self.gpu, 2 * nbytes)
                    )
                self.bucket.append((name, numel))
            if self.cfg.user_wait_stream:  # the user's post-accumulate-grad hook, registered after DeepSpeed's
                with host.frames(*self.fr.user_grad_hook()):
                    host.spend(10.0, "user-hook")
                    host.wait_stream(COMPUTE, self.reduce_stream)

    def flush(self) -> Step:
        """__reduce_and_partition_ipg_grads."""
        if not self.bucket:
            return
        host, cfg = self.host, self.cfg
        elements = sum(n for _, n in self.bucket)
        world = cfg.world_size
        dtype = cfg.communication_data_type
        with host.frames(*self.fr.reduce_ipg()):
            host.spend(60.0, "flush")
            while self.reduce_events:
                done = yield from host.query(self.reduce_events[0])
                if not done:
                    break
                self.reduce_events.popleft()
            if cfg.reduce_event_throttle and len(self.reduce_events) > MAX_ONGOING:
                yield from host.synchronize_event(self.reduce_events.popleft())
            with host.frames(*self.fr.reduce_scatter()):
                if dtype == "fp32":
                    for _, n in self.bucket:
                        self.elementwise("aten::to", "cast", n * 6, self.reduce_stream)
                size = DTYPE_BYTES[dtype]
                self.elementwise("aten::cat", "cat", elements * size * 2, self.reduce_stream)
                self.elementwise("aten::div_", "div", elements * size * 2, self.reduce_stream)
                op = yield from self.collective(
                    "reduce_scatter",
                    self.rs_pg,
                    elements,
                    dtype,
                    self.reduce_stream,
                    False,
                    (),
                    self.fr.reduce_scatter_tail(),
                )
                op.modules = tuple(dict.fromkeys(self._path(self._module_of(n)) for n, _ in self.bucket))
            with host.frames(*self.fr.partition_grads()):
                part = elements // world
                if cfg.offload_optimizer:
                    pinned = cfg.offload_pin_memory
                    name = f"Memcpy DtoH (Device -> {'Pinned' if pinned else 'Pageable'})"
                    self.memcpy(name, part * 4, self.reduce_stream, host_copy_us(part * 4, pinned))
                    if not cfg.deepspeed_at_least("0.19.5"):  # blocking copy_ before DS PR #8207
                        yield from host.synchronize_stream(self.reduce_stream)
                else:
                    self.elementwise("aten::add_", "add_f32", part * 12, self.reduce_stream)
            self.bucket = []
            self.reduce_events.append(host.record(self.reduce_stream))

    # -- the step ----------------------------------------------------------------------------
    def forward(self) -> Step:
        host, m = self.host, self.m
        t, h = m.tokens, m.hidden
        order = list(range(len(self.modules)))
        model = ("nn.Module: DeepSpeedEngine_0",)
        with self._mark("python_function", *model), host.frames(*self.fr.engine_forward()):
            for mod in order:
                frame = "nn.Module: " + ("Embedding_0" if mod == 0 else f"Block_{mod - 1}")
                with self._mark("python_function", frame):
                    with host.frames(*self.fr.pre_forward_hook()):
                        yield from self.fetch(mod, order)
                    host.spend(80.0, "module-forward")
                    if mod == 0:
                        self.elementwise("aten::embedding", "embedding", t * h * 4)
                    else:
                        self.block_forward()
                if mod != order[-1]:
                    self.available.discard(mod)  # released after use (the last block is reused at once)
            self.elementwise("aten::_log_softmax", "cross_entropy", t * m.vocab * 0.05)

    def block_forward(self) -> None:
        m = self.m
        t, h = m.tokens, m.hidden
        self.elementwise("aten::native_layer_norm", "layer_norm", t * h * 6)
        self.gemm(t, 3 * h, h)
        self.kernel(
            "aten::_flash_attention_forward", flash_name(False), attention_us(self.gpu, t, m.seq_len, h), "flash"
        )
        self.gemm(t, h, h)
        self.elementwise("aten::add", "add", t * h * 6)
        self.elementwise("aten::native_layer_norm", "layer_norm", t * h * 6)
        self.gemm(t, 4 * h, h)
        self.elementwise("aten::gelu", "gelu", t * 4 * h * 4)
        self.gemm(t, h, 4 * h)
        self.elementwise("aten::add", "add", t * h * 6)

    def autograd(self, function: str):
        """The autograd engine running one backward function (its kernels launch inside)."""
        self.autograd_seq += 1
        return self.host.cpu_op(
            f"autograd::engine::evaluate_function: {function}",
            {"Sequence number": self.autograd_seq, "Fwd thread id": 1},
            cost=3.0,
        )

    def backward_module(self, mod: int, order: list[int]) -> Step:
        host, m = self.host, self.m
        t, h = m.tokens, m.hidden
        with self.autograd("PreBackwardFunctionForModuleBackward"), host.frames(*self.fr.pre_backward_hook()):
            yield from self.fetch(mod, order)
        if self.cfg.backward_host_us > 0:  # the Python hooks of its submodules before its first kernel (deep tree)
            host.spend(self.cfg.backward_host_us, "submodule-hooks")
        if mod == 0:
            with self.autograd("EmbeddingBackward0"):
                self.elementwise("aten::embedding_dense_backward", "embedding_bwd", t * h * 8)
            yield from self.grad_ready("embed.weight", m.embed_params)
            self.available.discard(mod)
            return
        prefix = f"layers.{mod - 1}."
        sizes = dict(self.modules[mod])
        linear = "LinearFunctionForZeroStage3Backward"
        with self.autograd("AddBackward0"):
            self.elementwise("aten::add", "add", t * h * 6)
        for param, (rows, cols), before in (
            ("mlp.fc2.weight", (h, 4 * h), None),
            ("mlp.fc1.weight", (4 * h, h), ("GeluBackward0", "gelu")),
            ("attn.proj.weight", (h, h), ("NativeLayerNormBackward0", "ln")),
            ("attn.qkv.weight", (3 * h, h), ("FlashAttentionBackward0", "flash")),
        ):
            if before is not None:
                with self.autograd(before[0]):
                    if before[1] == "gelu":
                        self.elementwise("aten::gelu_backward", "gelu", t * 4 * h * 6)
                    elif before[1] == "ln":
                        self.elementwise("aten::native_layer_norm_backward", "layer_norm_bwd", t * h * 8)
                    else:
                        self.kernel(
                            "aten::_flash_attention_backward",
                            flash_name(True),
                            attention_us(self.gpu, t, m.seq_len, h, backward=True),
                            "flash",
                        )
            with self.autograd(linear):
                self.gemm(t, cols, rows, transposed=False)  # dgrad
                self.gemm(rows, cols, t, transposed=False)  # wgrad
            yield from self.grad_ready(prefix + param, sizes[prefix + param])
        with self.autograd("NativeLayerNormBackward0"):
            self.elementwise("aten::native_layer_norm_backward", "layer_norm_bwd", t * h * 8)
        self.available.discard(mod)

    def backward(self) -> Step:
        host = self.host
        order = list(range(len(self.modules)))[::-1]
        with host.frames(*self.fr.backward(), *self.fr.loss_backward()):
            host.spend(30.0, "backward-start")
            host.tid = host.autograd_tid
            with self.autograd("LogSoftmaxBackward0"):
                self.elementwise(
                    "aten::_log_softmax_backward_data", "cross_entropy", self.m.tokens * self.m.vocab * 0.05
                )
            for mod in order:
                yield from self.backward_module(mod, order)
            host.tid = host.main_tid
            host.spend(20.0, "backward-end")
        with host.frames(*self.fr.backward(), *self.fr.epilogue()):
            yield from self.flush()
            if self.cfg.epilogue_sync:
                yield from host.synchronize_stream(self.reduce_stream)
            else:  # counterfactual: a device-side dependency instead of a host-blocking sync
                host.wait_stream(COMPUTE, self.reduce_stream)

    def optimizer_step(self) -> Step:
        host, cfg = self.host, self.cfg
        part = self.m.parameters // cfg.world_size
        with host.frames(*self.fr.step()), host.annotation("Optimizer.step#DeepSpeedZeroOptimizer_Stage3.step"):
            with host.frames(*self.fr.grad_norm()):
                self.elementwise("aten::linalg_vector_norm", "norm", part * 4, COMPUTE)
                yield from self.collective(
                    "all_reduce", self.world, 1, "fp32", COMPUTE, False, (), self.fr.all_reduce()
                )
                if not cfg.deepspeed_at_least("0.14.3"):  # math.sqrt(total_norm) -> .item() (fixed by #5493)
                    with host.cpu_op("aten::item"):
                        self.memcpy("Memcpy DtoH (Device -> Pageable)", 4, COMPUTE, 2.5)
                        yield from host.synchronize_stream(COMPUTE)
            self.elementwise("aten::mul_", "add_f32", part * 8, COMPUTE)
            if cfg.offload_optimizer:
                host.spend(part / 2.5e3, "cpu-adam")  # DeepSpeedCPUAdam: ~2.5 G params/s on the host
                self.memcpy("Memcpy HtoD (Pinned -> Device)", part * 2, COMPUTE, host_copy_us(part * 2, True))
            else:
                self.kernel(
                    "aten::_fused_adam_", ELEMENTWISE["adam"], memory_us(self.gpu, part * 32), compute_bound=False
                )
            self.elementwise("aten::copy_", "cast", part * 6, COMPUTE)

    def step(self, step_no: int) -> Step:
        host, cfg = self.host, self.cfg
        self.step_no = step_no
        with ExitStack() as stack:
            stack.enter_context(host.frames(*self.fr.train_step()))
            stack.enter_context(host.annotation(f"ProfilerStep#{step_no}"))
            if cfg.host_delay_rank == host.rank and cfg.host_delay_us > 0:  # a slow data loader on this host
                with host.frames(*self.fr.dataloader()):
                    host.spend(cfg.host_delay_us)
            host.spend(60.0, "dataloader")
            if cfg.throughput_timer_sync:
                with host.frames(*self.fr.timer("start")):
                    yield from host.synchronize_device()
            t = self.m.tokens
            self.memcpy("Memcpy HtoD (Pinned -> Device)", t * 8, COMPUTE, host_copy_us(t * 8, True))
            with host.cpu_op("aten::zero_"):
                us = memory_us(self.gpu, 4 << 20)
                host.launch(
                    "Memset (Device)",
                    COMPUTE,
                    us,
                    kind="memset",
                    cls="memset",
                    args={"bytes": 4 << 20, "memory bandwidth (GB/s)": (4 << 20) / (us * 1e3)},
                )
            yield from self.forward()
            yield from self.backward()
            yield from self.optimizer_step()
            if cfg.throughput_timer_sync:
                with host.frames(*self.fr.timer("stop")):
                    yield from host.synchronize_device()
            host.spend(50.0, "step-end")
        host.spend(20.0, "between-steps")
