"""Classify each GPU activity once, by what it is: compute, communication (and which collective), memcpy, memset."""

from __future__ import annotations

import re
from functools import lru_cache

from overlapcheck.model import COLLECTIVE_KINDS

# Activity classes (stored as small ints in the model's arrays).
COMPUTE, COMM, MEMCPY, MEMSET = 0, 1, 2, 3
CLASS_NAMES = ("compute", "comm", "memcpy", "memset")

# Collective kinds, in report order (indices into this tuple are stored in the model's arrays).
COLLECTIVES = COLLECTIVE_KINDS
NO_COLLECTIVE = -1

KERNEL_CATS = {"kernel", "Kernel"}
MEMCPY_CATS = {"gpu_memcpy", "Memcpy"}
MEMSET_CATS = {"gpu_memset", "Memset"}
GPU_CATS = KERNEL_CATS | MEMCPY_CATS | MEMSET_CATS
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
CPU_OP_CATS = {"cpu_op", "Operator"}

# NCCL/RCCL kernels of every generation: `ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)` (<= 2.18),
# `ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(...)` (>= 2.19), `ncclDevKernel_Generic`, `ncclKernel_SendRecv`;
# some demanglers prefix `void `.
_COMM_KERNEL = re.compile(r"^(?:void\s+)?(?:nccl|rccl)|nccl(?:Dev)?Kernel", re.IGNORECASE)

# Collective from a kernel name, by the operation token after the NCCL prefix.
_NAME_TOKENS = (
    ("reducescatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("allreduce", "all_reduce"),
    ("alltoall", "all_to_all"),
    ("sendrecv", "send_recv"),
    ("send", "send_recv"),
    ("recv", "send_recv"),
    ("broadcast", "broadcast"),
)

# `Collective name` args (record_param_comms): `_reduce_scatter_base`, `reduce_scatter_tensor_coalesced`,
# `_allgather_base`, `all_gather_into_tensor_coalesced`, `allreduce`, `alltoall_base`, `send`, ... Newer torch
# renames `*_base` to `*_single`.
_ARG_WORDS = re.compile(r"(?:^_+|_?(?:base|single|coalesced|tensor|into)$)")


def is_comm_kernel(name: str) -> bool:
    """True for an NCCL/RCCL communication kernel, whatever the NCCL generation."""
    return bool(_COMM_KERNEL.search(name))


@lru_cache(maxsize=4096)
def collective_from_name(name: str) -> str:
    """Collective kind from an NCCL kernel name; `other` when the name does not say (e.g. `ncclDevKernel_Generic`)."""
    m = re.search(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", name) or re.search(r"(?:nccl|rccl)[_:]*([A-Za-z]+)", name, re.I)
    token = (m.group(1) if m else name).lower()
    for key, kind in _NAME_TOKENS:
        if token.startswith(key):
            return kind
    return "other"


@lru_cache(maxsize=1024)
def collective_from_arg(value: str) -> str | None:
    """Collective kind from a `Collective name` arg, or None when it names no known collective (e.g. `coalesced`)."""
    word = value.strip().lower()
    while True:
        stripped = _ARG_WORDS.sub("", word)
        if stripped == word:
            break
        word = stripped
    word = word.replace("_", "")
    for key, kind in _NAME_TOKENS:
        if word == key or (key in ("allgather", "reducescatter", "alltoall") and word.startswith(key)):
            return kind
    if word in ("gather", "scatter", "reduce", "barrier"):
        return "other"
    return None


def collective_of(kernel_name: str, collective_arg: str | None) -> str:
    """The collective of a communication kernel: its `Collective name` arg when known, else its name."""
    if collective_arg:
        kind = collective_from_arg(collective_arg)
        if kind is not None:
            return kind
    return collective_from_name(kernel_name)
