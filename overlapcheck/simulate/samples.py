"""Regenerates the bundled `sample_traces/` exactly: `python -m overlapcheck.simulate.samples [DIR]`."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from overlapcheck.simulate import generate
from overlapcheck.simulate.scenarios import SAMPLE_PRESETS

# set name -> (scenario, options); the small sets use 2 nodes x 1 GPU to keep the folder small, except where
# the planted cause needs more GPUs per node (hpZ separates the communicators only with 2 or more)
SMALL = {"nodes": 2, "gpus_per_node": 1}
OWN_SIZE = {
    "seed-5201": {},
    "seed-5201-fixed": {},  # the seed's "after": the same job with its first fix
    "healthy": {},
    "same-communicator": {"nodes": 2, "gpus_per_node": 2},
    "degraded-network": {},  # 2x4: the slow network must dominate the exposed time (2x1 also has schedule waits)
}
SETS: dict[str, tuple[str, dict]] = {name: (name, OWN_SIZE.get(name, SMALL)) for name in SAMPLE_PRESETS}
# the seed (its own 4x8 cluster) as its own stack wrote it: DeepSpeed 0.13.3, torch 1.13.1, NCCL 2.14
SETS["seed-5201-ds013"] = ("seed-5201", {"layout": "ds013"})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    root = Path(argv[0] if argv else "sample_traces")
    root.mkdir(parents=True, exist_ok=True)
    for name, (scenario, options) in SETS.items():
        out = root / name
        if out.exists():
            shutil.rmtree(out)
        truth = generate(scenario, out, **options)
        size = sum(p.stat().st_size for p in out.iterdir())
        print(
            f"{name:18s} {len(truth['ranks']):3d} ranks {size / 1e6:6.2f} MB  "
            f"step {truth['step_time_us'] / 1000:7.2f} ms  "
            + ", ".join(f"{c['rule']} {c['cost_us'] / 1000:.2f} ms" for c in truth["causes"])
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
