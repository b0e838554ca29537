"""Kernel names and launch arguments as CUPTI reports them, per GPU architecture and NCCL version."""

from __future__ import annotations

from typing import Any

from overlapcheck.simulate.config import SimConfig

_GEMM = {
    "A100": "ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_tn",
    "H100": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_off_"
    "kernel__5x_cublas",
}
_GEMM_NN = {
    "A100": "ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_nn",
    "H100": "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_"
    "kernel__5x_cublas",
}
_FLASH_FWD = (
    "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<128, 128, 64, 4, false, "
    "false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> "
    ">, false, true, false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)"
)
_FLASH_BWD = (
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<pytorch_flash::"
    "Flash_bwd_kernel_traits<128, 64, 128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, "
    "pytorch_flash::Flash_kernel_traits<128, 64, 128, 8, cutlass::bfloat16_t> >, "
    "true, false, false, false, false, true, false, false>"
    "(pytorch_flash::Flash_bwd_params)"
)
ELEMENTWISE = {
    "layer_norm": "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
    "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
    "c10::BFloat16*)",
    "layer_norm_bwd": "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16,"
    " float>(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, "
    "c10::BFloat16 const*, c10::BFloat16*, int)",
    "gelu": "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&,"
    " at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::"
    "{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2> >(int, at::native::GeluCUDAKernelImpl("
    "at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
    "operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>)",
    "add": "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, "
    "at::detail::Array<char*, 3>)",
    "add_f32": "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)",
    "div": "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16,"
    " c10::BFloat16, at::native::binary_internal::DivFunctor<c10::BFloat16> >, at::detail::Array<char*, 3> >"
    "(int, at::native::BinaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
    "at::native::binary_internal::DivFunctor<c10::BFloat16> >, at::detail::Array<char*, 3>)",
    "cat": "void at::native::(anonymous namespace)::CatArrayBatchedCopy_aligned16_contig<at::native::(anonymous "
    "namespace)::OpaqueType<2u>, unsigned int, 1, 128, 1>(at::native::(anonymous namespace)::OpaqueType<2u>*,"
    " at::native::(anonymous namespace)::CatArrInputTensorMetadata<at::native::(anonymous namespace)::"
    "OpaqueType<2u>, unsigned int, 128, 1>, at::native::(anonymous namespace)::TensorSizeStride<unsigned int,"
    " 4u>, int, unsigned int)",
    "cast": "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)"
    "::{lambda()#3}::operator()() const::{lambda()#11}::operator()() const::{lambda(c10::BFloat16)#1}, "
    "at::detail::Array<char*, 2>, TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, "
    "unsigned int>, at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, "
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::"
    "{lambda()#11}::operator()() const::{lambda(c10::BFloat16)#1}, at::detail::Array<char*, 2>, "
    "TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
    "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1>)",
    "embedding": "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, "
    "2, -2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::"
    "TensorInfo<c10::BFloat16 const, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned "
    "int>, int, int, unsigned int, unsigned int, long)",
    "embedding_bwd": "void at::native::(anonymous namespace)::compute_grad_weight<c10::BFloat16, float>(long const*,"
    " c10::BFloat16 const*, long const*, long, long, long, float*)",
    "cross_entropy": "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, float, "
    "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, c10::BFloat16 const*, int)",
    "norm": "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::NormTwoOps<float, float, "
    "float>, unsigned int, float, 4> >(at::native::ReduceOp<float, at::native::NormTwoOps<float, float, "
    "float>, unsigned int, float, 4>)",
    "adam": "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>, float, float, float, float, "
    "float, float, adamMode_t, float>(long, int volatile*, TensorListMetadata<4>, AdamFunctor<float>, float, "
    "float, float, float, float, float, adamMode_t, float)",
    "fill": "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
    "at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
}

_LAUNCH = {  # family -> (registers per thread, shared memory, grid, block)
    "gemm": (168, 73728, [32, 16, 1], [256, 1, 1]),
    "flash": (255, 49152, [32, 32, 2], [128, 1, 1]),
    "elementwise": (32, 0, [1024, 1, 1], [128, 1, 1]),
    "nccl": (96, 87568, [32, 1, 1], [544, 1, 1]),
}


def gemm_name(cfg: SimConfig, transposed: bool = True) -> str:
    return (_GEMM if transposed else _GEMM_NN)[cfg.gpu]


def flash_name(backward: bool) -> str:
    return _FLASH_BWD if backward else _FLASH_FWD


def launch_args(family: str, sms: int) -> dict[str, Any]:
    regs, smem, grid, block = _LAUNCH[family]
    blocks = grid[0] * grid[1] * grid[2]
    warps = blocks * block[0] / 32 / sms
    return {
        "registers per thread": regs,
        "shared memory": smem,
        "blocks per SM": round(blocks / sms, 6),
        "warps per SM": round(warps, 6),
        "grid": grid,
        "block": block,
        "est. achieved occupancy %": 0 if family == "nccl" else min(100, int(warps * 100 / 64) or 1),
    }


_NCCL_OP = {"all_gather": "AllGather", "reduce_scatter": "ReduceScatter", "all_reduce": "AllReduce"}
_DTYPE_OLD = {"bf16": "__nv_bfloat16", "fp32": "float"}
_DTYPE_NEW = {"bf16": "bf16", "fp32": "f32"}


def nccl_kernel_name(cfg: SimConfig, collective: str, dtype: str) -> str:
    """The NCCL kernel of this NCCL generation (docs: knowledge/zero3-overlap.md, GPU side)."""
    op = _NCCL_OP[collective]
    if not cfg.nccl_at_least("2.19"):
        return (
            f"ncclKernel_{op}_RING_LL_Sum_{'int8_t' if collective == 'all_gather' else _DTYPE_OLD[dtype]}"
            "(ncclDevComm*, unsigned long, ncclWork*)"
        )
    args = (
        "(ncclDevKernelArgsStorage<4096ul>)"
        if cfg.nccl_at_least("2.22")
        else "(ncclDevComm*, unsigned long, ncclWork*)"
    )
    if collective == "all_gather":
        return f"ncclDevKernel_AllGather_RING_LL{args}"
    return f"ncclDevKernel_{op}_Sum_{_DTYPE_NEW[dtype]}_RING_LL{args}"
