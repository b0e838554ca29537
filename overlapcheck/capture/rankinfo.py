"""Facts about the current rank: identity, versions, device, relevant environment, DeepSpeed config."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "TORCH_DISTRIBUTED_")
ENV_NAMES = (
    "CUDA_DEVICE_MAX_CONNECTIONS",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_VISIBLE_DEVICES",
    "OMP_NUM_THREADS",
    "DS_ACCELERATOR",
    "PYTORCH_CUDA_ALLOC_CONF",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def relevant_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment variables that change how collectives and streams behave."""
    return {k: env[k] for k in sorted(env) if k.startswith(ENV_PREFIXES) or k in ENV_NAMES}


def identity() -> dict[str, Any]:
    """rank, world size, local rank and backend: from torch.distributed when initialized, else the env."""
    env = os.environ
    rank = _int(env.get("RANK", env.get("SLURM_PROCID", env.get("OMPI_COMM_WORLD_RANK"))), 0)
    world = _int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", env.get("OMPI_COMM_WORLD_SIZE"))), 1)
    local = _int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID")), None)
    backend = None
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world, backend = dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    except Exception:  # noqa: BLE001 - identity must never fail
        pass
    return {
        "rank": rank,
        "world_size": world,
        "local_rank": local,
        "backend": backend,
        "host": socket.gethostname(),
        "pid": os.getpid(),
    }


def versions() -> dict[str, str | None]:
    """Python, torch, CUDA, NCCL and DeepSpeed versions as this process sees them (imports nothing new)."""
    out: dict[str, str | None] = {
        "python": sys.version.split()[0],
        "torch": None,
        "cuda": None,
        "nccl": None,
        "deepspeed": None,
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = str(torch.__version__)
        out["cuda"] = getattr(torch.version, "cuda", None)
        try:
            if torch.cuda.is_available():
                nccl = torch.cuda.nccl.version()
                out["nccl"] = ".".join(str(x) for x in nccl) if isinstance(nccl, tuple) else str(nccl)
        except Exception:  # noqa: BLE001
            pass
    ds = sys.modules.get("deepspeed")
    if ds is not None:
        out["deepspeed"] = str(getattr(ds, "__version__", None))
    return out


def gpu_name(local_rank: int | None) -> str | None:
    """The name of this rank's GPU, only when CUDA is already initialized (never initializes it)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return str(torch.cuda.get_device_name(torch.cuda.current_device()))
    except Exception:  # noqa: BLE001
        pass
    return None


def resolved_ds_config(engine: Any) -> dict[str, Any] | None:
    """The DeepSpeed config as the engine uses it: the user's dict with batch sizes and ZeRO settings resolved."""
    cfg = getattr(engine, "_config", None)
    if cfg is None:
        return None
    out = dict(getattr(cfg, "_param_dict", None) or {})
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        value = getattr(cfg, key, None)
        if value is not None:
            out[key] = value
    zero = getattr(cfg, "zero_config", None)
    dump = getattr(zero, "model_dump", None) or getattr(zero, "dict", None)
    if dump is not None:
        with contextlib.suppress(Exception):
            out["zero_optimization"] = _jsonable(dump())
    return _jsonable(out)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [_jsonable(v) for v in obj]
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    value = getattr(obj, "value", None)  # enums
    return value if isinstance(value, str | int | float) else str(obj)


def _int(text: str | None, default: int | None) -> int | None:
    try:
        return int(text) if text is not None else default
    except ValueError:
        return default
