# ruff: noqa: E501  (kernel names and event argument rows are kept on one line each)
"""An independent event-level generator of multi-rank DeepSpeed ZeRO-3 step traces (Kineto JSON).

Written without reading `overlapcheck/simulate/` or `tests/builders.py`: its structure is copied from the real
traces in /work/shared/traces (record_param_comms args, NCCL kernel names and args, ac2g flows, External id,
distributedInfo, deviceProperties, baseTimeNanoseconds) and from DeepSpeed 0.19.8's ZeRO-3 code paths
(partitioned_param_coordinator.fetch_sub_module, stage3.__add_grad_to_ipg_bucket /
__reduce_and_partition_ipg_grads / independent_gradient_partition_epilogue), as /work/shared/knowledge
describes them.

Model. Every rank runs the same program (SPMD). Ops are processed in program order for all ranks at once, so a
collective's end is known when its op is reached: it ends on every rank at `max(start over ranks) + transfer`
(lockstep: no rank finishes before the last one arrived). Each rank has a host clock (launch costs, Python
overhead, blocking syncs) and per-stream GPU clocks; compute runs on stream 7, all-gathers on the world
communicator's NCCL stream, reduce-scatters (synchronous, torch >= 2.8) on DeepSpeed's reduce stream with the
cloned world group. Timing: compute from a FLOP model of a transformer layer at an effective rate, per-kernel
lognormal jitter; collectives as alpha + bytes x busbw factor / busbw, busbw the slowest hop (NVLink inside a
node, the per-GPU NIC share across nodes). Trace timestamps carry a per-node clock offset and drift.
"""

from __future__ import annotations

import gzip
import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

COMPUTE = 7
AG_STREAM = 20  # ProcessGroupNCCL stream of the world group (all-gathers, async_op=True)
RS_STREAM = 24  # DeepSpeed's reduce_and_partition_stream (reduce-scatter runs on it, async_op=False, torch >= 2.8)
FETCH_STREAM = 22  # DeepSpeed's __allgather_stream (the handle's unflatten / wait side)
HPZ_STREAM = 28  # ProcessGroupNCCL stream of hpZ's per-node zero_param_process_group
A2A_STREAM = 7  # MoE all-to-all: synchronous, on the current stream
T0_US = 5_121_000_000.0  # trace clock origin, µs
BASE_NS = 1_764_633_600_000_000_000

DS = "deepspeed/runtime/zero/"
TRAIN = ["train.py(88): <module>", "train.py(61): train_epoch"]
FWD = [*TRAIN, "deepspeed/runtime/engine.py(2131): forward", "torch/nn/modules/module.py(1784): _call_impl"]
FETCH = [
    "torch/nn/modules/module.py(1838): _call_impl",
    f"{DS}parameter_offload.py(473): _pre_forward_module_hook",
    f"{DS}parameter_offload.py(606): pre_sub_module_forward_function",
    f"{DS}partitioned_param_coordinator.py(310): fetch_sub_module",
]
AGC = [
    f"{DS}partitioned_param_coordinator.py(530): __all_gather_params",
    f"{DS}partitioned_param_coordinator.py(560): __all_gather_params_",
    f"{DS}partition_parameters.py(1235): all_gather_coalesced",
]
AGFN = ["deepspeed/comm/comm.py(352): allgather_fn", "deepspeed/comm/torch.py(227): all_gather_into_tensor"]
BWD = [*TRAIN, "deepspeed/runtime/engine.py(2284): backward", "torch/_tensor.py(647): backward"]
BWD_T: list[str] = []  # the autograd thread: Python frames start where the engine calls back into Python
BFETCH = [
    "torch/autograd/function.py(307): apply",
    f"{DS}parameter_offload.py(431): backward",
    f"{DS}parameter_offload.py(385): _run_before_backward_function",
    f"{DS}parameter_offload.py(634): pre_sub_module_backward_function",
    f"{DS}partitioned_param_coordinator.py(310): fetch_sub_module",
]
HOOK = [
    f"{DS}stage3.py(1252): reduce_partition_and_remove_grads",
    f"{DS}stage3.py(1519): reduce_independent_p_g_buckets_and_remove_grads",
]
FLUSH = [f"{DS}stage3.py(1570): __reduce_and_partition_ipg_grads"]
RSFN = [
    f"{DS}stage3.py(1617): __avg_scatter_grads",
    "deepspeed/runtime/comm/coalesced_collectives.py(108): reduce_scatter_coalesced",
    "deepspeed/comm/comm.py(283): reduce_scatter_fn",
    "deepspeed/comm/torch.py(304): reduce_scatter_tensor",
]
LOGW = "deepspeed/comm/comm.py(117): log_wrapper"
ARFN = [  # contiguous_gradients with reduce_scatter false: the bucket is all-reduced (2x the bytes)
    f"{DS}stage3.py(1863): __avg_scatter_contiguous_grads",
    "deepspeed/comm/comm.py(117): log_wrapper",
    "deepspeed/comm/comm.py(497): all_reduce",
    "deepspeed/comm/torch.py(156): all_reduce",
]
STEP = [*TRAIN, "deepspeed/runtime/engine.py(2409): step", "deepspeed/runtime/engine.py(2321): _take_model_step"]

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
GEMM_B = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nt_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_off_kernel__5x_cublas"
FLASH = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>, false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)"
FLASH_B = "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t>, true, false, false, false, false, false>(pytorch_flash::Flash_bwd_params)"
LNORM = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)"
GELU = "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)"
ADAM = "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, float, float, float, float, float, adamMode_t, float>(long, int volatile*, TensorListMetadata<4>, AdamFunctor<float>, float, float, float, float, float, float, adamMode_t, float)"
CAST = "void at::native::vectorized_elementwise_kernel<4, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)"
DIV = "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::DivFunctor<c10::BFloat16> >, std::array<char*, 3ul> >(int, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, at::native::binary_internal::DivFunctor<c10::BFloat16> >, std::array<char*, 3ul>)"
LOSS = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, float, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, c10::BFloat16 const*, int)"

EMB_B = "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<c10::BFloat16, float, long>(long const*, c10::BFloat16 const*, float*, int, long, int)"

QUANT = "void cached_quantization<__nv_bfloat16, 1, 8, 4, 8>(signed char*, float*, __nv_bfloat16 const*, int, int, int)"
DEQUANT = (
    "void dequantize_kernel<__nv_bfloat16, 8, 8>(__nv_bfloat16*, signed char const*, float const*, int, int, int, int)"
)
QGROUP = 2048  # elements per quantization group (one fp32 scale each)

NORM = "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float, float, float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::NormTwoOps<float, float, float>, unsigned int, float, 4>)"

DTYPE = {
    "int8": ("Char", 1, "i8"),
    "bf16": ("BFloat16", 2, "bf16"),
    "fp32": ("Float", 4, "f32"),
    "fp16": ("Half", 2, "f16"),
    "uint8": ("Byte", 1, "u8"),
}


@dataclass
class Cfg:
    nodes: int = 2
    gpn: int = 4
    layers: int = 8
    hidden: int = 2048
    tokens: int = 8192  # per micro-batch per GPU
    steps: int = 3
    accum: int = 1
    eff_tflops: float = 330.0  # effective bf16 matmul rate
    comm_dtype: str = "bf16"
    overlap_comm: bool = True
    prefetch_layers: int = 2  # layers gathered ahead at each fetch (0: on demand)
    fetch_host_us: float = 35.0  # Python overhead of one fetch_sub_module
    kernel_host_us: float = 9.0  # host time per launched op
    lag_host_us: float = 0.0  # extra Python time per sub-module (host-bound jobs)
    reduce_bucket: float = 5e7
    persist_threshold: float = 1e5
    intra_gbps: float = 330.0  # NVLink busbw
    nic_gbps: float = 48.0  # per-GPU inter-node busbw
    nic_by_node: dict[int, float] = field(default_factory=dict)
    gpu_speed: dict[int, float] = field(default_factory=dict)  # rank -> compute time factor
    node_speed: dict[int, float] = field(default_factory=dict)
    clock_offset_us: dict[int, float] = field(default_factory=dict)
    drift_ppm: dict[int, float] = field(default_factory=dict)
    max_conn1: bool = False
    item_sync: bool = False  # loss.item() between forward and backward (user logging)
    idle_sync: bool = False  # a torch.cuda.synchronize() at the step end, after the GPU drained
    offload_param_pageable: bool = False
    moe_layers: tuple[int, ...] = ()
    moe_tokens_bytes: float = 0.0
    jitter: float = 0.02
    random_late_us: float = 0.0  # at each collective one rank drawn at random arrives this late after its queued work
    contention: float = 1.5  # a collective's time when the other kind holds the link at its start
    seed: int = 0
    extra_params: list[int] = field(default_factory=list)  # small per-layer params (layer norms, biases)
    # ---- round 5 ----
    recompute: bool = False  # activation checkpointing: each layer's forward re-run in backward before its grads
    hpz: bool = False  # ZeRO++ hpZ (zero_hpz_partition_size = gpn): backward gathers inside the node's own group
    dataloader_us: dict[int, float] = field(default_factory=dict)  # step -> host µs in DataLoader.__next__
    step0_no_prefetch: bool = False  # DeepSpeed's trace cache is being recorded in the first step: no prefetch
    first_step_number: int = 2  # N of the first ProfilerStep#N (2: the profiler waited 1 and warmed up 1 step)
    step0_lag_us: float = 0.0  # extra host time per sub-module in the first step (allocator warm-up, tracing)
    allreduce_grads: bool = False  # zero_optimization.reduce_scatter false: buckets all-reduced, not reduce-scattered
    comms_logger: bool = False  # comms_logger.enabled: timed_op synchronizes the device after every collective
    offload_opt_cpu_adam_us: float = 0.0  # offload_optimizer cpu, pinned: host µs of DeepSpeedCPUAdam per step
    norm_sync: bool = False  # DeepSpeed < 0.14.5 gradient clipping: global-norm all-reduce + .item() in step()
    expert_allreduce_numel: int = 0  # MoE: expert grads all-reduced on the expert-DP group, on the reduce stream
    qwz: bool = False  # ZeRO++ qwZ: int8 weight all-gathers + their fp32 scales, quantize / dequantize kernels
    embed_numel: int = 0  # an untied input embedding in layer 0: gathered with it, its gradient produced last
    # ---- round 6 ----
    user_hook_wait_rs: bool = False  # a user grad hook: current_stream().wait_stream(reduce stream) per gradient
    bwd_speed: dict[int, float] = field(default_factory=dict)  # rank -> compute time factor in backward only
    nccl_proto: str = "LL"  # the protocol in NCCL's kernel names (NCCL_PROTO=Simple: _RING_SIMPLE)
    kernel_host_by_rank: dict[int, float] = field(default_factory=dict)  # rank -> host µs per launched op
    persist_post_step: bool = False  # _post_step re-gathers persistent params (one all_gather each) + synchronize
    fp16_overflow: bool = False  # fp16 loss scaling: has_overflow's wait_stream, MAX all-reduce (Byte), .item()
    train_dtype: str = "bf16"  # the model's dtype: a gradient cast is launched only when comm_dtype differs


@dataclass
class Rank:
    rank: int
    node: int
    local: int
    pid: int
    tid_main: int
    tid_bwd: int
    host: float = 0.0
    dev_free: float = 0.0  # the one hardware queue (max_conn1)
    streams: dict[int, float] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    stack: dict[int, list[tuple[str, float, int, int]]] = field(default_factory=dict)  # tid -> open frames
    corr: int = 1000
    ext: int = 500
    pyid: int = 100
    last_launch_end: float = 0.0


class Sim:
    def __init__(self, cfg: Cfg) -> None:
        self.c = cfg
        self.rng = random.Random(cfg.seed)
        self.world = cfg.nodes * cfg.gpn
        self.ranks = [
            Rank(r, r // cfg.gpn, r % cfg.gpn, 41000 + 17 * r, 41000 + 17 * r, 41000 + 17 * r + 9)
            for r in range(self.world)
        ]
        h = cfg.hidden
        # one transformer layer's parameters, as DeepSpeed partitions them (numel)
        self.layer_params = [3 * h * h, h * h, 4 * h * h, 4 * h * h, *cfg.extra_params]
        self.bucket: list[int] = []
        self.seq = {"0": 0, "1": 0}
        self.step = 0
        # extra process groups (name, ranks): hpZ's per-node secondary-partition groups
        self.extra_pgs: list[tuple[str, list[int]]] = []
        if cfg.hpz:
            for n in range(cfg.nodes):
                self.extra_pgs.append((str(2 + n), list(range(n * cfg.gpn, (n + 1) * cfg.gpn))))
        self.outstanding: list[dict[int, float]] = []  # reduce events recorded, per rank: when they complete
        self.inflight: dict[str, float] = {}

    # ---------- timing ----------
    def jit(self) -> float:
        return math.exp(self.rng.gauss(0.0, self.c.jitter))

    def busbw(self) -> float:
        if self.c.nodes == 1:
            return self.c.intra_gbps
        nic = min(self.c.nic_by_node.get(n, self.c.nic_gbps) for n in range(self.c.nodes))
        return min(self.c.intra_gbps, nic)

    def xfer_us(self, nbytes: float, kind: str, n: int | None = None, intra: bool = False) -> float:
        n = n or self.world
        factor = {"ag": (n - 1) / n, "rs": (n - 1) / n, "ar": 2 * (n - 1) / n, "a2a": (n - 1) / n}[kind]
        alpha = (10.0 if self.c.nodes == 1 or intra else 24.0) + 3.0 * math.log2(n)
        bw = self.c.intra_gbps if intra else self.busbw()
        return (alpha + nbytes * factor / (bw * 1e3)) * self.jit()

    def speed(self, r: Rank, tid: int | None = None) -> float:
        f = self.c.gpu_speed.get(r.rank, 1.0) * self.c.node_speed.get(r.node, 1.0)
        if tid is not None and tid == r.tid_bwd:
            f *= self.c.bwd_speed.get(r.rank, 1.0)
        return f

    # ---------- event emission ----------
    def clock(self, r: Rank, t: float) -> float:
        drift = self.c.drift_ppm.get(r.node, 0.0) * 1e-6
        return round(T0_US + t * (1 + drift) + self.c.clock_offset_us.get(r.node, 0.0), 3)

    def ev(self, r: Rank, **e: Any) -> dict[str, Any]:
        e.setdefault("ph", "X")
        if "ts" in e:
            if "dur" in e:
                end = self.clock(r, e["ts"] + e["dur"])
                e["ts"] = self.clock(r, e["ts"])
                e["dur"] = round(end - e["ts"], 3)
            else:
                e["ts"] = self.clock(r, e["ts"])
        r.events.append(e)
        return e

    def frames(self, r: Rank, tid: int, stack: list[str]) -> None:
        """Make `stack` the open python_function frames of `tid` at the host time (closing and opening)."""
        open_ = r.stack.setdefault(tid, [])
        k = 0
        while k < len(open_) and k < len(stack) and open_[k][0] == stack[k]:
            k += 1
        for name, start, pyid, parent in reversed(open_[k:]):
            self.ev(
                r,
                cat="python_function",
                name=name,
                pid=r.pid,
                tid=tid,
                ts=start,
                dur=max(0.5, r.host - start),
                args={"Python id": pyid, "Python parent id": parent},
            )
            r.host += 0.2
        del open_[k:]
        for name in stack[k:]:
            r.pyid += 1
            open_.append((name, r.host, r.pyid, open_[-1][2] if open_ else 0))
            r.host += 0.6

    def close_all(self, r: Rank) -> None:
        for tid in list(r.stack):
            self.frames(r, tid, [])

    def launch(
        self,
        r: Rank,
        tid: int,
        name: str,
        stream: int,
        dur: float,
        deps: tuple[float, ...] = (),
        cat: str = "kernel",
        op: str = "aten::mm",
        comm: dict[str, Any] | None = None,
        runtime: str = "cudaLaunchKernel",
        extra: dict[str, Any] | None = None,
        blocking: bool = False,
        start_at: float | None = None,
    ) -> tuple[float, float, dict[str, Any]]:
        """A host op launching one GPU activity; returns (gpu start, gpu end, the activity event)."""
        r.ext += 1
        r.corr += 1
        t_op = r.host
        op_args: dict[str, Any] = {"External id": r.ext, "Record function id": 0}
        r.host += 2.0
        ext = r.ext
        if comm is not None:
            r.ext += 1
            rec = {"External id": r.ext, "Record function id": 0, **comm}
            self.ev(r, cat="cpu_op", name="record_param_comms", pid=r.pid, tid=tid, ts=r.host, dur=3.0 + 0.2, args=rec)
            ext = r.ext
            r.host += 1.0
            r.ext += 1
            self.ev(
                r,
                cat="user_annotation",
                name=comm["_nccl_title"],
                pid=r.pid,
                tid=tid,
                ts=r.host,
                dur=self.c.kernel_host_us,
                args={"External id": r.ext, "Record function id": 0},
            )
            del rec["_nccl_title"]
        launch_t = r.host + 1.0
        ldur = 4.0 + 2.0 * self.rng.random()
        rt = self.ev(
            r,
            cat="cuda_runtime",
            name=runtime,
            pid=r.pid,
            tid=tid,
            ts=launch_t,
            dur=ldur,
            args={"External id": ext, "cbid": 211 if runtime == "cudaLaunchKernel" else 41, "correlation": r.corr},
        )
        self.ev(r, ph="s", id=r.corr, pid=r.pid, tid=tid, ts=launch_t, cat="ac2g", name="ac2g")
        start = max(launch_t + ldur * 0.5 + 2.0, r.streams.get(stream, 0.0), *deps)
        if start_at is not None:
            start = max(start, start_at)
        if self.c.max_conn1:
            start = max(start, r.dev_free)
        end = start + dur
        r.host = max(r.host + self.c.kernel_host_by_rank.get(r.rank, self.c.kernel_host_us), launch_t + ldur + 0.5)
        args: dict[str, Any] = {
            "External id": ext,
            "device": r.local,
            "context": 1,
            "stream": stream,
            "correlation": r.corr,
        }
        if cat == "kernel":
            args.update({"queued": 0, "registers per thread": 128, "grid": [132, 1, 1], "block": [384, 1, 1]})
        if comm is not None:
            args.update({k: v for k, v in comm.items() if not k.startswith("_")})
        if extra:
            args.update(extra)
        e = self.ev(r, cat=cat, name=name, pid=r.local, tid=stream, ts=start, dur=dur, args=args)
        self.ev(r, ph="f", id=r.corr, pid=r.local, tid=stream, ts=start, cat="ac2g", name="ac2g", bp="e")
        self.ev(r, cat="cpu_op", name=op, pid=r.pid, tid=tid, ts=t_op, dur=r.host - t_op - 0.3, args=op_args)
        r.streams[stream] = end
        r.dev_free = max(r.dev_free, end)
        if blocking:  # a pageable copy: the call returns when its data has gone
            done = end + 3.0
            rt["dur"] = round(self.clock(r, done) - rt["ts"], 3)
            r.host = max(r.host, done + 1.0)
            self.ev(r, cat="cpu_op", name=op, pid=r.pid, tid=tid, ts=t_op, dur=r.host - t_op - 0.3, args=op_args)
            r.events.pop(-2)
        return start, end, e

    def runtime(self, r: Rank, tid: int, name: str, dur: float = 2.0, args: dict[str, Any] | None = None) -> None:
        r.corr += 1
        self.ev(
            r,
            cat="cuda_runtime",
            name=name,
            pid=r.pid,
            tid=tid,
            ts=r.host,
            dur=dur,
            args={"External id": r.ext, "cbid": 0, "correlation": r.corr, **(args or {})},
        )
        r.host += dur + 1.0

    def block(self, r: Rank, tid: int, name: str, until: float) -> None:
        """A host-blocking call that returns when GPU work ending at `until` has ended."""
        start = r.host
        end = max(start + 3.0, until + 4.0)
        r.corr += 1
        self.ev(
            r,
            cat="cuda_runtime",
            name=name,
            pid=r.pid,
            tid=tid,
            ts=start,
            dur=end - start,
            args={"External id": r.ext, "cbid": 0, "correlation": r.corr},
        )
        r.host = end + 1.0

    def wait_event(self, r: Rank, tid: int) -> None:
        self.runtime(r, tid, "cudaEventRecord", 1.5)
        self.runtime(r, tid, "cudaStreamWaitEvent", 1.5)

    # ---------- collectives (all ranks together) ----------
    def collective(
        self,
        kind: str,
        nelems: int,
        stream_of: dict[int, int],
        tids: dict[int, int],
        stack: dict[int, list[str]],
        deps: dict[int, tuple[float, ...]],
        dtype: str = "bf16",
        group: list[int] | None = None,
        pg_name: str | None = None,
        redop: str = "Sum",
    ) -> dict[int, tuple[float, float]]:
        """One collective on the world (or on `group`, a communicator inside one node, named `pg_name`)."""
        tname, size, suf = DTYPE[dtype]
        proto = self.c.nccl_proto
        pg = pg_name or ("0" if kind in ("ag", "a2a") else "1")
        members = [self.ranks[i] for i in group] if group else self.ranks
        n = len(members)
        intra = group is not None and len({r.node for r in members}) == 1
        self.seq[pg] = self.seq.get(pg, 0) + 1
        nbytes = nelems * size
        x = self.xfer_us(nbytes, kind, n, intra)
        # all-gathers and reduce-scatters share the node's NICs: one that starts while the other kind is still in
        # flight moves at a share of the link (a crude model; NCCL rings on one NIC interleave their chunks)
        first = min(max(r.host, r.streams.get(stream_of[r.rank], 0.0)) for r in members)
        other = self.inflight.get("rs" if kind == "ag" else "ag", 0.0)
        if self.c.nodes > 1 and not intra and other > first:
            x *= self.c.contention
        info = {
            "ag": (
                "_allgather_base",
                "nccl:_all_gather_base",
                "c10d::_allgather_base_",
                f"ncclDevKernel_AllGather_RING_{proto}(ncclDevKernelArgsStorage<4096ul>)",
            ),
            "rs": (
                "_reduce_scatter_base",
                "nccl:_reduce_scatter_base",
                "c10d::_reduce_scatter_base_",
                f"ncclDevKernel_ReduceScatter_Sum_{suf}_RING_{proto}(ncclDevKernelArgsStorage<4096ul>)",
            ),
            "ar": (
                "allreduce",
                "nccl:all_reduce",
                "c10d::allreduce_",
                f"ncclDevKernel_AllReduce_{redop}_{suf}_RING_{proto}(ncclDevKernelArgsStorage<4096ul>)",
            ),
            "a2a": (
                "all_to_allv",
                "nccl:all_to_all",
                "c10d::alltoall_base_",
                "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
            ),
        }[kind]
        shard = nelems // n
        ins, outs = {"ag": (shard, nelems), "rs": (nelems, shard), "a2a": (nelems, nelems), "ar": (nelems, nelems)}[
            kind
        ]
        res: dict[int, tuple[float, float]] = {}
        evs = {}
        late_rank = self.rng.randrange(self.world) if self.c.random_late_us else -1
        if self.c.comms_logger:  # every deepspeed.comm op runs inside comm.py's log_wrapper (timed_op)
            stack = {k: [*v[:-1], LOGW, v[-1]] for k, v in stack.items()}
        for r in members:
            tid = tids[r.rank]
            self.frames(r, tid, stack[r.rank])
            comm = {
                "_nccl_title": info[1],
                "Collective name": info[0],
                "dtype": tname,
                "In msg nelems": ins,
                "Out msg nelems": outs,
                "Group size": n,
                "In split size": "[]",
                "Out split size": "[]",
                "Process Group Name": pg,
                "Process Group Description": "default_pg" if pg == "0" else "undefined",
                "Process Group Ranks": "[" + ", ".join(str(m.rank) for m in members) + "]",
                "Rank": r.rank,
                "Seq": self.seq[pg],
            }
            dep = deps.get(r.rank, ())
            if self.c.random_late_us and r.rank == late_rank:  # arrives late after its own queued work
                frontier = max(r.streams.get(stream_of[r.rank], 0.0), r.streams.get(COMPUTE, 0.0), r.host)
                dep = (*dep, frontier + self.c.random_late_us * (0.5 + self.rng.random()))
            s, _, e = self.launch(r, tid, info[3], stream_of[r.rank], x, dep, op=info[2], comm=comm)
            evs[r.rank] = (s, e)
        last = max(s for s, _ in evs.values())
        end = last + x
        if not intra:
            self.inflight[kind] = end
        for r in members:
            s, e = evs[r.rank]
            dur = end - s
            drift = self.c.drift_ppm.get(r.node, 0.0) * 1e-6
            e["dur"] = round(dur * (1 + drift), 3)
            stream = stream_of[r.rank]
            r.streams[stream] = end
            r.dev_free = max(r.dev_free, end)
            self.ev(
                r,
                cat="gpu_user_annotation",
                name=info[1],
                pid=r.local,
                tid=stream,
                ts=s,
                dur=dur,
                args={"External id": e["args"]["External id"]},
            )
            res[r.rank] = (s, end)
        if self.c.comms_logger:  # log_wrapper: get_accelerator().synchronize() once the op returned, then log it
            for r in members:
                tid = tids[r.rank]
                self.frames(
                    r,
                    tid,
                    [
                        *stack[r.rank][:-1],
                        "deepspeed/accelerator/cuda_accelerator.py(79): synchronize",
                        "torch/cuda/__init__.py(985): synchronize",
                    ],
                )
                self.block(r, tid, "cudaDeviceSynchronize", max(r.streams.values()))
                self.frames(r, tid, stack[r.rank][:-1])
                r.host += 25.0  # the logger's bookkeeping (msg size, latency, bandwidth)
        return res

    # ---------- the training step ----------
    def compute(self, r: Rank, tid: int, kernels: list[tuple[str, str, float]], deps: tuple[float, ...] = ()) -> float:
        end = 0.0
        for i, (name, op, us) in enumerate(kernels):
            if tid == r.tid_bwd:  # the autograd engine runs each backward node inside this op
                node = {
                    "aten::mm": "MmBackward0",
                    "aten::gelu_backward": "GeluBackward0",
                    "aten::native_layer_norm_backward": "NativeLayerNormBackward0",
                    "aten::_flash_attention_backward": "ScaledDotProductFlashAttentionBackward0",
                }.get(op, "AddmmBackward0")
                t0 = r.host
                r.host += 1.5
                _, end, _ = self.launch(
                    r,
                    tid,
                    name,
                    COMPUTE,
                    us * self.speed(r, tid) * math.exp(self.rng.gauss(0, 0.015)),
                    deps if i == 0 else (),
                    op=op,
                )
                r.ext += 1
                self.ev(
                    r,
                    cat="cpu_op",
                    name=f"autograd::engine::evaluate_function: {node}",
                    pid=r.pid,
                    tid=tid,
                    ts=t0,
                    dur=r.host - t0 + 0.5,
                    args={"External id": r.ext, "Record function id": 0, "Sequence number": r.ext},
                )
                r.host += 1.0
                if self.c.lag_host_us:
                    r.host += self.c.lag_host_us / len(kernels)
                continue
            _, end, _ = self.launch(
                r,
                tid,
                name,
                COMPUTE,
                us * self.speed(r, tid) * math.exp(self.rng.gauss(0, 0.015)),
                deps if i == 0 else (),
                op=op,
            )
            if self.c.lag_host_us:
                r.host += self.c.lag_host_us / len(kernels)
        return end

    def recompute(self, r: Rank, dep: float) -> None:
        """Activation checkpointing: the layer's forward kernels again, inside CheckpointFunctionBackward."""
        stack = [
            "torch/autograd/function.py(307): apply",
            "deepspeed/runtime/activation_checkpointing/checkpointing.py(689): backward",
            "torch/nn/modules/module.py(1784): _call_impl",
            "model.py(74): forward",
        ]
        self.frames(r, r.tid_bwd, stack)
        t0 = r.host
        r.ext += 1
        ext = r.ext
        for i, (name, op, us) in enumerate(self.layer_kernels(False)):
            self.launch(
                r,
                r.tid_bwd,
                name,
                COMPUTE,
                us * self.speed(r) * math.exp(self.rng.gauss(0, 0.015)),
                (dep,) if i == 0 else (),
                op=op,
            )
        self.ev(
            r,
            cat="cpu_op",
            name="autograd::engine::evaluate_function: CheckpointFunctionBackward",
            pid=r.pid,
            tid=r.tid_bwd,
            ts=t0,
            dur=r.host - t0 + 0.5,
            args={"External id": ext, "Record function id": 0, "Sequence number": ext},
        )
        r.host += 1.0
        self.frames(r, r.tid_bwd, ["torch/autograd/function.py(307): apply"])

    def layer_kernels(self, backward: bool) -> list[tuple[str, str, float]]:
        h, t = self.c.hidden, self.c.tokens
        f = 2 * t / (self.c.eff_tflops * 1e6)  # µs per parameter
        q, o, m = 3 * h * h * f, h * h * f, 4 * h * h * f
        attn = 4 * t * 2048 * h / (self.c.eff_tflops * 0.7 * 1e6)
        small = max(6.0, t * h * 2 * 3 / 2.4e6)
        if not backward:
            return [
                (LNORM, "aten::native_layer_norm", small),
                (GEMM, "aten::addmm", q),
                (FLASH, "aten::_flash_attention_forward", attn),
                (GEMM, "aten::addmm", o),
                (LNORM, "aten::native_layer_norm", small),
                (GEMM, "aten::addmm", m),
                (GELU, "aten::gelu", small),
                (GEMM, "aten::addmm", m),
            ]
        return [
            (GEMM_B, "aten::mm", m),
            (GEMM_B, "aten::mm", m),
            (GELU, "aten::gelu_backward", small),
            (GEMM_B, "aten::mm", m),
            (GEMM_B, "aten::mm", m),
            (LNORM, "aten::native_layer_norm_backward", small),
            (GEMM_B, "aten::mm", 2 * o),
            (FLASH_B, "aten::_flash_attention_backward", 2.3 * attn),
            (GEMM_B, "aten::mm", 2 * q),
            (LNORM, "aten::native_layer_norm_backward", small),
        ]

    def gathers(self, layers: list[int], backward: bool) -> dict[int, dict[int, float]]:
        """All-gather each layer's parameters (one coalesced all_gather_into_tensor per layer)."""
        done: dict[int, dict[int, float]] = {}
        for li in layers:
            numel = sum(p for p in self.layer_params if p > self.c.persist_threshold)
            if li == 0:
                numel += self.c.embed_numel
            tids = {r.rank: (r.tid_bwd if backward else r.tid_main) for r in self.ranks}
            base = (BFETCH if backward else FWD + FETCH) + AGC
            stacks = {r.rank: base + AGFN for r in self.ranks}
            deps: dict[int, tuple[float, ...]] = {}
            if self.c.offload_param_pageable:
                for r in self.ranks:  # param.ds_tensor.to(device) from pageable CPU memory: blocks the host
                    self.frames(r, tids[r.rank], base)
                    nbytes = numel // self.world * 2
                    dur = nbytes / (6.5 * 1e3)
                    _, e, _ = self.launch(
                        r,
                        tids[r.rank],
                        "Memcpy HtoD (Pageable -> Device)",
                        AG_STREAM,
                        dur,
                        cat="gpu_memcpy",
                        op="aten::copy_",
                        runtime="cudaMemcpyAsync",
                        extra={"bytes": nbytes},
                        blocking=True,
                    )
                    deps[r.rank] = (e,)
            if self.c.qwz:  # quantize the shard on the gather stream, all-gather int8 + scales, dequantize
                res = self.quantized_gather(numel, tids, base, stacks)
            elif (
                self.c.hpz and backward
            ):  # hpZ: gather the node's secondary partition inside the node (own communicator)
                res = {}
                for pg, members in self.extra_pgs:
                    res.update(
                        self.collective(
                            "ag",
                            numel,
                            {m: HPZ_STREAM for m in members},
                            tids,
                            stacks,
                            deps,
                            group=members,
                            pg_name=pg,
                        )
                    )
            else:
                stream = {r.rank: AG_STREAM for r in self.ranks}
                res = self.collective("ag", numel, stream, tids, stacks, deps)
            done[li] = {k: v[1] for k, v in res.items()}
        return done

    def quantized_gather(
        self, numel: int, tids: dict[int, int], base: list[str], stacks: dict[int, list[str]]
    ) -> dict[int, tuple[float, float]]:
        """qwZ (zero_quantized_weights): the gather side of ZeRO++ as all_gather_coalesced runs it."""
        qstack = [
            *base,
            f"{DS}partition_parameters.py(1188): _all_gather_dtype",
            "deepspeed/ops/quantizer.py(58): quantize",
        ]
        deps: dict[int, tuple[float, ...]] = {}
        shard = numel // self.world
        for r in self.ranks:
            self.frames(r, tids[r.rank], qstack)
            _, e, _ = self.launch(r, tids[r.rank], QUANT, FETCH_STREAM, shard * 3 / 2.6e6 + 4.0, op="aten::empty")
            deps[r.rank] = (e,)
        stream = {r.rank: AG_STREAM for r in self.ranks}
        data = self.collective("ag", numel, stream, tids, stacks, deps, dtype="int8")
        scales = self.collective("ag", max(self.world, numel // QGROUP), stream, tids, stacks, {}, dtype="fp32")
        res: dict[int, tuple[float, float]] = {}
        for r in self.ranks:
            self.frames(
                r,
                tids[r.rank],
                [*base, f"{DS}partition_parameters.py(1021): wait", "deepspeed/ops/quantizer.py(77): dequantize"],
            )
            self.runtime(r, tids[r.rank], "cudaStreamWaitEvent", 1.5)
            s, e, _ = self.launch(
                r, tids[r.rank], DEQUANT, FETCH_STREAM, numel * 3 / 2.6e6 + 4.0, (data[r.rank][1], scales[r.rank][1])
            )
            res[r.rank] = (data[r.rank][0], e)
        return res

    def run(self) -> None:
        c = self.c
        for r in self.ranks:
            r.host = 200.0 + 40 * self.rng.random()
        for step in range(c.steps):
            self.step = step
            step_start = {r.rank: r.host for r in self.ranks}
            for r in self.ranks:
                self.frames(r, r.tid_main, TRAIN)
                self.frames(r, r.tid_main, TRAIN + ["torch/utils/data/dataloader.py(733): __next__"])
                r.host += 180 + 30 * self.rng.random()
                if step in c.dataloader_us:  # drawn only then: the other scenarios keep their random sequence
                    r.host += c.dataloader_us[step] * (0.97 + 0.06 * self.rng.random())
                self.frames(r, r.tid_main, TRAIN)
                self.launch(
                    r,
                    r.tid_main,
                    "Memcpy HtoD (Pinned -> Device)",
                    COMPUTE,
                    6.0,
                    cat="gpu_memcpy",
                    op="aten::copy_",
                    runtime="cudaMemcpyAsync",
                    extra={"bytes": c.tokens * 8},
                )
            for micro in range(c.accum):
                self.forward()
                self.backward(last_micro=micro == c.accum - 1)
            self.optimizer()
            for r in self.ranks:
                self.close_all(r)
                if c.idle_sync:
                    r.host = max(r.host, max(r.streams.values()) + 30.0)
                    self.frames(r, r.tid_main, TRAIN + ["torch/cuda/__init__.py(985): synchronize"])
                    self.block(r, r.tid_main, "cudaDeviceSynchronize", max(r.streams.values()))
                    self.close_all(r)
                r.host += 60.0
                self.ev(
                    r,
                    cat="user_annotation",
                    name=f"ProfilerStep#{step + c.first_step_number}",
                    pid=r.pid,
                    tid=r.tid_main,
                    ts=step_start[r.rank] - 1.0,
                    dur=r.host - step_start[r.rank],
                    args={"External id": 1 + step, "Record function id": 0},
                )
                r.host += 15.0

    def forward(self) -> None:
        c = self.c
        ready: dict[int, dict[int, float]] = {}
        first = self.step == 0
        ahead = 0 if first and c.step0_no_prefetch else c.prefetch_layers
        lag = c.lag_host_us + (c.step0_lag_us if first else 0.0)
        for li in range(c.layers):
            want = [x for x in range(li, min(c.layers, li + 1 + ahead)) if x not in ready]
            for r in self.ranks:
                self.frames(r, r.tid_main, FWD + FETCH)
                r.host += c.fetch_host_us + lag
            if want:
                ready.update(self.gathers(want, backward=False))
            for r in self.ranks:
                self.frames(
                    r, r.tid_main, FWD + FETCH + [f"{DS}partitioned_param_coordinator.py(418): _fetch_sub_module_impl"]
                )
                self.wait_event(r, r.tid_main)
                self.frames(
                    r, r.tid_main, FWD + ["torch/nn/modules/module.py(1795): _call_impl", "model.py(74): forward"]
                )
                kern = self.layer_kernels(False)
                if li in c.moe_layers:  # attention here; the expert MLP runs between the all-to-alls (moe())
                    kern = kern[:5]
                self.compute(r, r.tid_main, kern, (ready[li][r.rank],))
            if li in c.moe_layers:
                self.moe(li)
        for r in self.ranks:
            self.frames(r, r.tid_main, [*TRAIN, "deepspeed/runtime/engine.py(2131): forward", "model.py(102): loss"])
            self.compute(r, r.tid_main, [(LOSS, "aten::_log_softmax", 60.0)])
            if c.item_sync:  # loss.item() for logging: a DtoH copy and a stream sync, the host waits for forward
                self.frames(r, r.tid_main, [*TRAIN, "train.py(66): log_loss"])
                self.launch(
                    r,
                    r.tid_main,
                    "Memcpy DtoH (Device -> Pageable)",
                    COMPUTE,
                    2.0,
                    cat="gpu_memcpy",
                    op="aten::_local_scalar_dense",
                    runtime="cudaMemcpyAsync",
                    extra={"bytes": 4},
                )
                self.block(r, r.tid_main, "cudaStreamSynchronize", r.streams[COMPUTE])

    def moe(self, li: int) -> None:
        """Expert dispatch: all-to-all on the compute stream, expert MLP, combine all-to-all."""
        nel = int(self.c.moe_tokens_bytes // 2)
        for phase in range(2):
            tids = {r.rank: r.tid_main for r in self.ranks}
            stacks = {
                r.rank: FWD
                + [
                    "deepspeed/moe/sharded_moe.py(540): forward",
                    "deepspeed/moe/sharded_moe.py(96): forward",
                    "deepspeed/comm/comm.py(420): all_to_all_single",
                ]
                for r in self.ranks
            }
            self.collective("a2a", nel, {r.rank: A2A_STREAM for r in self.ranks}, tids, stacks, {})
            if phase == 0:
                for r in self.ranks:
                    self.frames(r, r.tid_main, FWD + ["deepspeed/moe/experts.py(35): forward"])
                    self.compute(r, r.tid_main, self.layer_kernels(False)[5:])

    def backward(self, last_micro: bool) -> None:
        c = self.c
        rs_stream = RS_STREAM if c.overlap_comm else COMPUTE
        ready: dict[int, dict[int, float]] = {}
        for r in self.ranks:
            self.frames(r, r.tid_main, BWD + ["torch/autograd/graph.py(829): _engine_run_backward"])
            r.host += 25.0
        first = self.step == 0
        ahead = 0 if first and c.step0_no_prefetch else c.prefetch_layers
        lag = c.lag_host_us + (c.step0_lag_us if first else 0.0)
        for li in reversed(range(c.layers)):
            want = [x for x in range(li, max(-1, li - 1 - ahead), -1) if x not in ready]
            for r in self.ranks:
                r.host = max(r.host, 0.0)
                self.frames(r, r.tid_bwd, BFETCH)
                r.host += c.fetch_host_us + lag
            if want:
                ready.update(self.gathers(want, backward=True))
            for r in self.ranks:
                self.frames(
                    r, r.tid_bwd, BFETCH + [f"{DS}partitioned_param_coordinator.py(418): _fetch_sub_module_impl"]
                )
                self.wait_event(r, r.tid_bwd)
            if c.recompute:  # CheckpointFunction.backward re-runs the layer's forward on the autograd thread
                for r in self.ranks:
                    self.recompute(r, ready[li][r.rank])
            # each parameter's gradient hook fires once the kernels producing its gradient were launched
            kern = self.layer_kernels(True)
            segments = [(kern[0:2], 3), (kern[2:4], 2), (kern[4:7], 1), (kern[7:10], 0)]
            for i, (ks, p) in enumerate(segments):
                for r in self.ranks:
                    self.frames(r, r.tid_bwd, ["torch/autograd/function.py(307): apply"])
                    self.compute(r, r.tid_bwd, ks, (ready[li][r.rank],) if i == 0 else ())
                self.grad_hook(self.layer_params[p], rs_stream)
            for p in self.layer_params[4:]:
                self.grad_hook(p, rs_stream)
            if li == 0 and c.embed_numel:  # the embedding's backward (index_add) is the last compute of backward
                for r in self.ranks:
                    self.frames(r, r.tid_bwd, ["torch/autograd/function.py(307): apply"])
                    self.compute(
                        r, r.tid_bwd, [(EMB_B, "aten::embedding_dense_backward", c.tokens * c.hidden * 2 * 3 / 2.4e6)]
                    )
                self.grad_hook(c.embed_numel, rs_stream)
        for r in self.ranks:
            self.frames(
                r,
                r.tid_bwd,
                [
                    "torch/autograd/function.py(307): apply",
                    f"{DS}parameter_offload.py(449): _run_after_backward_hook",
                    f"{DS}stage3.py(1357): independent_gradient_partition_epilogue",
                ],
            )
        if self.bucket:
            self.flush(rs_stream, epilogue=True)
        for r in self.ranks:
            self.frames(
                r,
                r.tid_bwd,
                [
                    "torch/autograd/function.py(307): apply",
                    f"{DS}parameter_offload.py(449): _run_after_backward_hook",
                    f"{DS}stage3.py(1357): independent_gradient_partition_epilogue",
                    "torch/cuda/streams.py(105): synchronize",
                ],
            )
            self.block(r, r.tid_bwd, "cudaStreamSynchronize", r.streams.get(rs_stream, 0.0))
            self.frames(r, r.tid_bwd, [])
            r.host += 4.0
            self.frames(r, r.tid_main, [])
        self.outstanding.clear()

    def grad_hook(self, numel: int, rs_stream: int) -> None:
        if sum(self.bucket) + numel > self.c.reduce_bucket and self.bucket:
            self.flush(rs_stream)
        self.bucket.append(numel)
        for r in self.ranks:  # __add_grad_to_ipg_bucket: reduce stream waits for compute, copy_ into the flat buffer
            bwd = BWD_T
            self.frames(r, r.tid_bwd, bwd + HOOK + [f"{DS}stage3.py(1543): __add_grad_to_ipg_bucket"])
            r.host += 12.0
            self.wait_event(r, r.tid_bwd)
            dur = numel * 2 * 2 / (2.6e3 * 1e3) + 2.0
            self.launch(
                r,
                r.tid_bwd,
                "Memcpy DtoD (Device -> Device)",
                rs_stream,
                dur,
                deps=(r.streams.get(COMPUTE, 0.0),),
                cat="gpu_memcpy",
                op="aten::copy_",
                runtime="cudaMemcpyAsync",
                extra={"bytes": numel * 2},
            )
        if self.c.user_hook_wait_rs:
            self.user_hook_wait(rs_stream)

    def user_hook_wait(self, rs_stream: int) -> None:
        """A user gradient hook (param.register_hook, e.g. a gradient monitor reading the reduced buffer) that makes
        the current stream wait for DeepSpeed's reduce stream: torch.cuda.current_stream().wait_stream(s) is a
        cudaEventRecord on s and a cudaStreamWaitEvent on the current stream. Compute queued after it starts only
        once everything already on the reduce stream (the bucket's copy, an in-flight reduce-scatter) is done."""
        for r in self.ranks:
            self.frames(r, r.tid_bwd, ["train.py(31): _grad_monitor_hook", "torch/cuda/streams.py(83): wait_stream"])
            r.host += 6.0
            self.wait_event(r, r.tid_bwd)
            r.streams[COMPUTE] = max(r.streams.get(COMPUTE, 0.0), r.streams.get(rs_stream, 0.0))
            self.frames(r, r.tid_bwd, [])

    def flush(self, rs_stream: int, epilogue: bool = False) -> None:
        c = self.c
        numel = sum(self.bucket)
        self.bucket = []
        bwd = BWD_T
        ep = [
            "torch/autograd/function.py(307): apply",
            f"{DS}parameter_offload.py(449): _run_after_backward_hook",
            f"{DS}stage3.py(1357): independent_gradient_partition_epilogue",
        ]
        pre = (ep if epilogue else bwd + HOOK) + FLUSH
        # max_param_reduce_events = 2: the host waits for the oldest reduction when more are outstanding
        if len(self.outstanding) >= 2:
            until = self.outstanding.pop(0)
            for r in self.ranks:
                self.frames(r, r.tid_bwd, pre + ["torch/cuda/streams.py(225): synchronize"])
                self.block(r, r.tid_bwd, "cudaEventSynchronize", until[r.rank])
        for r in self.ranks:
            self.frames(r, r.tid_bwd, pre + (ARFN if c.allreduce_grads else RSFN)[:1])
            if c.comm_dtype != c.train_dtype:
                self.launch(r, r.tid_bwd, CAST, rs_stream, numel * 6 / 2.6e6 + 3.0, op="aten::to")
            self.launch(
                r,
                r.tid_bwd,
                DIV,
                rs_stream,
                numel * (4 if c.comm_dtype == "fp32" else 2) * 2 / 2.6e6 + 3.0,
                op="aten::div_",
            )
        fn = ARFN if c.allreduce_grads else RSFN
        res = self.collective(
            "ar" if c.allreduce_grads else "rs",
            numel,
            {r.rank: rs_stream for r in self.ranks},
            {r.rank: r.tid_bwd for r in self.ranks},
            {r.rank: pre + fn for r in self.ranks},
            {},
            dtype=c.comm_dtype,
        )
        for r in self.ranks:
            self.frames(r, r.tid_bwd, pre + [f"{DS}stage3.py(1886): partition_grads"])
            self.launch(r, r.tid_bwd, CAST, rs_stream, numel / self.world * 6 / 2.6e6 + 3.0, op="aten::copy_")
            if c.offload_opt_cpu_adam_us:  # offload_optimizer, pinned, >= 0.19.5: the fp32 grad partition to the host
                nbytes = numel // self.world * 4
                self.launch(
                    r,
                    r.tid_bwd,
                    "Memcpy DtoH (Device -> Pinned)",
                    rs_stream,
                    nbytes / (22.0 * 1e3),
                    cat="gpu_memcpy",
                    op="aten::copy_",
                    runtime="cudaMemcpyAsync",
                    extra={"bytes": nbytes},
                )
            self.runtime(r, r.tid_bwd, "cudaEventRecord", 1.5)
        self.outstanding.append({r.rank: r.streams[rs_stream] for r in self.ranks})
        del res

    def norm_sync(self) -> None:
        """DeepSpeed < 0.14.5 stage3 step(): the gradient norm of the partition, an all-reduce of it over the data-
        parallel group (synchronous: on the current stream) and `.item()` on it (DtoH copy + stream sync)."""
        numel = (sum(self.layer_params) * self.c.layers) // self.world
        stack = STEP + [
            f"{DS}stage3.py(2245): step",
            f"{DS}stage3.py(2062): _overflow_clean_and_get_norm",
            f"{DS}stage3.py(1675): get_grad_norm_direct",
        ]
        for r in self.ranks:
            self.frames(r, r.tid_main, stack)
            self.wait_event(r, r.tid_main)
            self.launch(
                r,
                r.tid_main,
                NORM,
                COMPUTE,
                numel * 4 / 2.6e6 + 4.0,
                (r.streams.get(RS_STREAM, 0.0),),
                op="aten::linalg_vector_norm",
            )
        self.collective(
            "ar",
            1,
            {r.rank: COMPUTE for r in self.ranks},
            {r.rank: r.tid_main for r in self.ranks},
            {
                r.rank: [*stack, "deepspeed/comm/comm.py(117): log_wrapper", "deepspeed/comm/torch.py(156): all_reduce"]
                for r in self.ranks
            },
            {},
            dtype="fp32",
        )
        for r in self.ranks:
            self.frames(r, r.tid_main, [*stack, "torch/_tensor.py(1120): item"])
            self.launch(
                r,
                r.tid_main,
                "Memcpy DtoH (Device -> Pageable)",
                COMPUTE,
                2.0,
                cat="gpu_memcpy",
                op="aten::_local_scalar_dense",
                runtime="cudaMemcpyAsync",
                extra={"bytes": 4},
            )
            self.block(r, r.tid_main, "cudaStreamSynchronize", r.streams[COMPUTE])

    def cpu_optimizer(self, numel: int) -> None:
        """offload_optimizer to CPU (pinned): DeepSpeedCPUAdam on the host (the gradients are already there, the
        epilogue synchronized the reduce stream), then the updated bf16 partition copied back, pinned and async."""
        for r in self.ranks:
            self.frames(r, r.tid_main, STEP + [f"{DS}stage3.py(2245): step", f"{DS}stage3.py(2156): _optimizer_step"])
            self.frames(
                r,
                r.tid_main,
                [
                    *STEP,
                    f"{DS}stage3.py(2245): step",
                    f"{DS}stage3.py(2156): _optimizer_step",
                    "deepspeed/ops/adam/cpu_adam.py(144): step",
                ],
            )
            r.ext += 1
            t0 = r.host
            r.host += self.c.offload_opt_cpu_adam_us * (0.98 + 0.04 * self.rng.random())
            self.ev(
                r,
                cat="cpu_op",
                name="ds_adam_step",
                pid=r.pid,
                tid=r.tid_main,
                ts=t0,
                dur=r.host - t0,
                args={"External id": r.ext, "Record function id": 0},
            )
            self.frames(
                r,
                r.tid_main,
                STEP
                + [f"{DS}stage3.py(2245): step", f"{DS}stage3.py(2181): _reassign_or_swap_out_partitioned_parameters"],
            )
            self.launch(
                r,
                r.tid_main,
                "Memcpy HtoD (Pinned -> Device)",
                COMPUTE,
                numel * 2 / (22.0 * 1e3),
                cat="gpu_memcpy",
                op="aten::copy_",
                runtime="cudaMemcpyAsync",
                extra={"bytes": numel * 2},
            )
            self.frames(r, r.tid_main, STEP + [f"{DS}stage3.py(2210): _post_step"])
            r.host += 40.0
            self.frames(r, r.tid_main, [])

    def fp16_overflow(self) -> None:
        """fp16 loss scaling in stage3 step(): has_overflow(partition_gradients=True) makes the default stream wait
        for the reduce stream, checks the partition for inf/nan, all-reduces the flag (MAX, a ByteTensor, over the
        data-parallel group, on the current stream) and reads it with .item() (DtoH + stream sync)."""
        numel = (sum(self.layer_params) * self.c.layers) // self.world
        stack = STEP + [
            f"{DS}stage3.py(2245): step",
            f"{DS}stage3.py(2123): _overflow_check_and_loss_scale_update",
            f"{DS}stage3.py(2081): check_overflow",
            f"{DS}stage3.py(2731): has_overflow",
        ]
        for r in self.ranks:
            self.frames(r, r.tid_main, stack)
            self.wait_event(r, r.tid_main)
            self.launch(
                r,
                r.tid_main,
                NORM,
                COMPUTE,
                numel * 2 / 2.6e6 + 4.0,
                (r.streams.get(RS_STREAM, 0.0),),
                op="aten::isinf",
            )
        self.collective(
            "ar",
            1,
            {r.rank: COMPUTE for r in self.ranks},
            {r.rank: r.tid_main for r in self.ranks},
            {
                r.rank: [*stack, "deepspeed/comm/comm.py(117): log_wrapper", "deepspeed/comm/torch.py(156): all_reduce"]
                for r in self.ranks
            },
            {},
            dtype="uint8",
            redop="Max",
        )
        for r in self.ranks:
            self.frames(r, r.tid_main, [*stack, "torch/_tensor.py(1120): item"])
            self.launch(
                r,
                r.tid_main,
                "Memcpy DtoH (Device -> Pageable)",
                COMPUTE,
                2.0,
                cat="gpu_memcpy",
                op="aten::_local_scalar_dense",
                runtime="cudaMemcpyAsync",
                extra={"bytes": 1},
            )
            self.block(r, r.tid_main, "cudaStreamSynchronize", r.streams[COMPUTE])

    def persistent_gather(self) -> None:
        """_post_step: the persistent parameters (numel <= stage3_param_persistence_threshold) are partitioned for the
        optimizer and re-gathered after it, one all_gather per parameter (_allgather_params_coalesced), then
        get_accelerator().synchronize() (zero3-overlap.md, Other synchronizations)."""
        pers = [p for p in self.layer_params if p <= self.c.persist_threshold]
        stack = STEP + [
            f"{DS}stage3.py(2210): _post_step",
            f"{DS}partition_parameters.py(1330): all_gather",
            f"{DS}partition_parameters.py(2062): _allgather_params_coalesced",
        ]
        for r in self.ranks:  # the gathers read the partitions Adam just updated
            self.frames(r, r.tid_main, stack)
            self.wait_event(r, r.tid_main)
            r.streams[AG_STREAM] = max(r.streams.get(AG_STREAM, 0.0), r.streams.get(COMPUTE, 0.0))
        for _ in range(self.c.layers):
            for numel in pers:
                self.collective(
                    "ag",
                    numel,
                    {r.rank: AG_STREAM for r in self.ranks},
                    {r.rank: r.tid_main for r in self.ranks},
                    {r.rank: [*stack, *AGFN] for r in self.ranks},
                    {},
                )
        for r in self.ranks:
            self.frames(
                r,
                r.tid_main,
                [
                    *stack,
                    "deepspeed/accelerator/cuda_accelerator.py(79): synchronize",
                    "torch/cuda/__init__.py(985): synchronize",
                ],
            )
            self.block(r, r.tid_main, "cudaDeviceSynchronize", max(r.streams.values()))
            self.frames(r, r.tid_main, [])

    def optimizer(self) -> None:
        numel = (sum(self.layer_params) * self.c.layers + self.c.embed_numel) // self.world
        if self.c.norm_sync:
            self.norm_sync()
        if self.c.fp16_overflow:
            self.fp16_overflow()
        if self.c.offload_opt_cpu_adam_us:
            self.cpu_optimizer(numel)
            return
        for r in self.ranks:
            self.frames(r, r.tid_main, STEP + [f"{DS}stage3.py(2245): step"])
            self.wait_event(r, r.tid_main)
            chunks = 6
            for _ in range(chunks):
                self.launch(
                    r,
                    r.tid_main,
                    ADAM,
                    COMPUTE,
                    numel * 16 / 2.9e6 / chunks * self.speed(r),
                    deps=(r.streams.get(RS_STREAM, 0.0),),
                    op="aten::_fused_adam_",
                )
            self.frames(r, r.tid_main, STEP + [f"{DS}stage3.py(2210): _post_step"])
            r.host += 40.0
            self.frames(r, r.tid_main, [])
        if self.c.persist_post_step:
            self.persistent_gather()


def write(cfg: Cfg, out: Path, ds_config: dict[str, Any] | None, run_json: dict[str, Any] | None) -> None:
    sim = Sim(cfg)
    sim.run()
    out.mkdir(parents=True, exist_ok=True)
    tdir = out / "traces" if run_json is not None else out
    tdir.mkdir(parents=True, exist_ok=True)
    for r in sim.ranks:
        r.events.sort(key=lambda e: (e.get("ts", 0.0), -e.get("dur", 0.0)))
        doc = {
            "schemaVersion": 1,
            "deviceProperties": [
                {
                    "id": i,
                    "name": "NVIDIA H100 80GB HBM3",
                    "totalGlobalMem": 85045231616,
                    "computeMajor": 9,
                    "computeMinor": 0,
                    "maxThreadsPerBlock": 1024,
                    "maxThreadsPerMultiprocessor": 2048,
                    "regsPerBlock": 65536,
                    "warpSize": 32,
                    "sharedMemPerBlock": 49152,
                    "numSms": 132,
                    "regsPerMultiprocessor": 65536,
                    "sharedMemPerBlockOptin": 232448,
                    "sharedMemPerMultiprocessor": 233472,
                }
                for i in range(cfg.gpn)
            ],
            "distributedInfo": {
                "backend": "nccl",
                "rank": r.rank,
                "world_size": sim.world,
                "pg_count": 2 + len(sim.extra_pgs),
                "pg_config": [
                    {
                        "pg_name": "0",
                        "pg_desc": "default_pg",
                        "backend_config": "cuda:nccl",
                        "pg_size": sim.world,
                        "ranks": list(range(sim.world)),
                    },
                    {
                        "pg_name": "1",
                        "pg_desc": "undefined",
                        "backend_config": "cuda:nccl",
                        "pg_size": sim.world,
                        "ranks": list(range(sim.world)),
                    },
                    *(
                        {
                            "pg_name": name,
                            "pg_desc": "undefined",
                            "backend_config": "cuda:nccl",
                            "pg_size": len(members),
                            "ranks": members,
                        }
                        for name, members in sim.extra_pgs
                    ),
                ],
                "nccl_version": "2.27.5",
            },
            "traceEvents": [
                {"ph": "M", "name": "process_name", "pid": r.pid, "tid": 0, "args": {"name": "python3"}},
                {"ph": "M", "name": "process_name", "pid": r.local, "tid": 0, "args": {"name": f"GPU {r.local}"}},
                {"ph": "M", "name": "thread_name", "pid": r.pid, "tid": r.tid_bwd, "args": {"name": "pt_autograd_0"}},
                *r.events,
            ],
            "traceName": f"/scratch/run/traces/rank{r.rank}.pt.trace.json",
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": BASE_NS,
        }
        name = f"rank{r.rank}.pt.trace.json.gz" if run_json is not None else f"rank{r.rank}.trace.json.gz"
        with open(tdir / name, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=3, mtime=0) as fh:
            fh.write(json.dumps(doc).encode())  # mtime=0: the same scenario gives the same bytes
    if ds_config is not None and run_json is None:
        (out / "ds_config.json").write_text(json.dumps(ds_config, indent=1))
    if run_json is not None:
        run_json = dict(run_json)
        run_json.setdefault("ds_config", ds_config)
        run_json["world_size"] = sim.world
        run_json["hosts"] = [f"gpu-node-{n:02d}" for n in range(cfg.nodes)]
        run_json["ranks"] = [
            {
                "rank": r.rank,
                "host": f"gpu-node-{r.node:02d}",
                "local_rank": r.local,
                "pid": r.pid,
                "driver": "deepspeed",
                "gpu": "NVIDIA H100 80GB HBM3",
                "capture": {
                    "status": "ok",
                    "trace": f"traces/rank{r.rank}.pt.trace.json.gz",
                    "complete": True,
                    "steps_captured": {"first": cfg.first_step_number, "last": cfg.first_step_number + cfg.steps - 1},
                },
            }
            for r in sim.ranks
        ]
        (out / "run.json").write_text(json.dumps(run_json, indent=1))
