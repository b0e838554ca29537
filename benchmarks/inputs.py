"""Build the benchmark inputs under benchmarks/data/ (kept between runs; delete the folder to rebuild)."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from benchmarks.tile import tile

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
REAL = os.path.join(HERE, "..", "..", "shared", "traces", "nccl-single-rank", "control.json.gz")
MB = 1 << 20


@dataclass
class Input:
    name: str
    path: str  # plain JSON, one rank
    gz: str | None = None  # the same trace gzipped
    folder: str | None = None  # a multi-rank set it belongs to

    @property
    def size(self) -> int:
        return os.path.getsize(self.path)


def _gunzip(src: str, dst: str) -> None:
    with gzip.open(src, "rb") as f, open(dst + ".tmp", "wb") as out:
        shutil.copyfileobj(f, out, 16 * MB)
    os.replace(dst + ".tmp", dst)


def _gzip(src: str, dst: str) -> None:
    subprocess.run(f"gzip -6 -c {src} > {dst}.tmp", shell=True, check=True)
    os.replace(dst + ".tmp", dst)


def simulated_set(ranks: int, steps: int) -> str:
    """A simulated ZeRO-3 job (overlapcheck simulate): one gzipped trace per rank, in its own folder."""
    folder = os.path.join(DATA, f"sim-{ranks}r-{steps}s")
    if not os.path.isfile(os.path.join(folder, "truth.json")):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "overlapcheck",
                "simulate",
                "--out",
                folder,
                "--nodes",
                "1",
                "--gpus-per-node",
                str(ranks),
                "--steps",
                str(steps),
                "--force",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return folder


def simulated(ranks: int, steps: int) -> Input:
    """Rank 0 of a simulated set, plain and gzipped; the set itself for the multi-rank runs."""
    folder = simulated_set(ranks, steps)
    gz = os.path.join(folder, "rank0.trace.json.gz")
    plain = os.path.join(DATA, f"sim-{ranks}r-{steps}s-rank0.json")
    if not os.path.isfile(plain):
        _gunzip(gz, plain)
    return Input(f"sim {os.path.getsize(plain) / MB:.0f} MB", plain, gz, folder)


def tiled(source: str, label: str, size_mb: int, with_gz: bool = False) -> Input:
    """`source` tiled in time to about `size_mb` MB (benchmarks/tile.py)."""
    path = os.path.join(DATA, f"{label}-{size_mb}MB.json")
    if not os.path.isfile(path):
        tile(source, path + ".tmp", size_mb * MB)
        os.replace(path + ".tmp", path)
    gz = path + ".gz" if with_gz else None
    if gz and not os.path.isfile(gz):
        _gzip(path, gz)
    return Input(f"{label} {os.path.getsize(path) / MB:.0f} MB", path, gz)


def build(quick: bool, big: bool) -> list[Input]:
    """The inputs: simulator traces of about 50 MB, 500 MB and 2 GB per rank and a real trace tiled to 500 MB;
    with `quick`, the 50 MB simulated trace and the real trace tiled to 100 MB."""
    os.makedirs(DATA, exist_ok=True)
    sim = simulated(ranks=2 if quick else 4, steps=80)
    if quick:
        return [sim, tiled(REAL, "real", 100)]
    out = [sim, tiled(sim.gz or sim.path, "sim", 500, with_gz=True), tiled(REAL, "real", 500, with_gz=True)]
    if big:
        out.append(tiled(sim.gz or sim.path, "sim", 2048))
    return out
