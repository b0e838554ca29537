"""What is known about the job besides its traces: one typed context that every diagnosis rule receives.

The pipeline reads the sources once (docs/architecture.md) and builds the context here, the only place that
knows where each fact comes from:
- the DeepSpeed config: `--ds-config`, else `ds_config.json` beside the traces, else the one in `run.json`;
- the run manifest `run.json` written by `overlapcheck run` (versions, environment, hosts);
- model facts: `model.json` beside the traces (`{"parameters": N}`);
- the simulator's job description, kept in its `ds_config.json` under `_overlapcheck_job` and
  `_overlapcheck_model` (taken out of the config the rules see).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from overlapcheck.errors import UserError

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
    if m is None or links < 1 or rate <= 0:
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
    ) -> JobContext:
        """The context from the documents as read (any may be None or of the wrong shape)."""
        config = ds_config if isinstance(ds_config, dict) else None
        run = run if isinstance(run, dict) else None
        if config is None and run is not None and isinstance(run.get("ds_config"), dict):
            config = run["ds_config"]
        job = _dict((config or {}).get(SIMULATOR_JOB_KEY))
        sim_model = _dict((config or {}).get(SIMULATOR_MODEL_KEY))
        if config is not None:
            config = {k: v for k, v in config.items() if k not in (SIMULATOR_JOB_KEY, SIMULATOR_MODEL_KEY)}
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
        )


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _parameters(doc: dict[str, Any]) -> int | None:
    for key in ("params", "parameters"):
        value = doc.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None
