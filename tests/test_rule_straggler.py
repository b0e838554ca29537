"""The cross-rank straggler rule (diagnose/rules/stragglers.py) on hand-built 4-rank traces whose waits are set
by hand: found by waiting time per collective kind, whatever the jitter-only collectives of other kinds say;
slow on the GPU or late on the host; deaf to jitter, to a slow network and to clock offsets."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from builders import kernel, launch, step, write_trace

from overlapcheck.capture.summary import summarize
from overlapcheck.model import Finding, Report
from overlapcheck.pipeline import analyze
from overlapcheck.report.json import JsonRenderer

GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n"
AG = "ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
RS = "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
ARGS = {
    AG: {"Collective name": "_allgather_base", "Process Group Name": "0", "In msg nelems": 4096, "dtype": "BFloat16"},
    RS: {
        "Collective name": "_reduce_scatter_base",
        "Process Group Name": "0",
        "In msg nelems": 16384,
        "dtype": "BFloat16",
    },
    AR: {"Collective name": "allreduce", "Process Group Name": "0", "In msg nelems": 4096, "dtype": "BFloat16"},
}
COMM = 21  # the NCCL stream; compute runs on stream 7
RANKS = 4
SITE = "/usr/lib/python3.10/site-packages/torch/utils/data/dataloader.py"
LOADER = f"{SITE}(628): __next__"


class Trace:
    """One rank's events on its own clock (`offset` shifts every timestamp: another node's clock)."""

    def __init__(self, offset: float = 0.0):
        self.events: list[dict[str, Any]] = []
        self.offset = offset
        self.corr = 0

    def step(self, number: int, ts: float, dur: float) -> None:
        self.events.append(step(number, ts + self.offset, dur))

    def frame(self, name: str, ts: float, dur: float) -> None:
        self.events.append(
            {
                "ph": "X",
                "cat": "python_function",
                "name": name,
                "pid": 100,
                "tid": 100,
                "ts": ts + self.offset,
                "dur": dur,
            }
        )

    def sync(self, ts: float, dur: float) -> None:
        self.corr += 1
        self.events.append(
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaDeviceSynchronize",
                "pid": 100,
                "tid": 100,
                "ts": ts + self.offset,
                "dur": dur,
                "args": {"correlation": self.corr},
            }
        )

    def gpu(self, name: str, host: float, start: float, dur: float) -> None:
        """A kernel launched at CPU time `host`, running [start, start + dur) (a collective on the NCCL stream)."""
        self.corr += 1
        stream = COMM if name in ARGS else 7
        self.events.append(launch(host + self.offset, self.corr))
        self.events.append(kernel(name, start + self.offset, dur, stream=stream, corr=self.corr, **ARGS.get(name, {})))


def write(folder: Path, traces: list[Trace]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for rank, t in enumerate(traces):
        write_trace(folder, f"rank{rank}.trace.json.gz", t.events, rank=rank, world_size=len(traces))
    return folder


def straggler(folder: Path) -> Finding | None:
    found = [f for f in analyze(folder, jobs=1).findings if f.rule == "straggler"]
    assert len(found) <= 1
    return found[0] if found else None


# ----------------------------------------------------------------------------------------- the traces


def partial_straggler(offsets: tuple[float, ...] = (0.0,) * RANKS, slow: int = 3) -> list[Trace]:
    """Rank `slow` computes 300 µs longer before each of 6 reduce-scatters per step (1800 µs per step): the
    others wait 300 µs in each, exposed. 24 all-gathers per step run under compute with 0-10 µs of jitter, the
    last to arrive at random: 48 jitter-only all-gathers against 12 telling reduce-scatters over 2 steps."""
    rng = random.Random(11)
    traces = [Trace(off) for off in offsets]
    for s in range(2):
        base = 20_000.0 * s
        for r, t in enumerate(traces):
            t.step(s + 1, base, 19_000)
            host, g = base + 10, base + 100
            for _ in range(24):
                t.gpu(GEMM, host, g, 200)
                t.gpu(AG, host + 1, g + 20, 100 + rng.randint(0, 10))
                host, g = host + 5, g + 200
            for _ in range(6):
                compute = 800 if r == slow else 500
                t.gpu(GEMM, host, g, compute)
                t.gpu(RS, host + 1, g + compute, 1300 - compute)  # kernels end together on every rank
                host, g = host + 5, g + 1300
    return traces


LATE_US = 8_000.0  # how much longer the late host's data loader takes per step
TRANSFER_US = 300.0  # the first all-gather's transfer time


def host_straggler(offsets: tuple[float, ...] = (0.0,) * RANKS, late: int = 2) -> list[Trace]:
    """The same GPU work on every rank; rank `late`'s data loader takes 8040 µs instead of 40 before each step's
    first launch (the first all-gather), so every other rank waits 8000 µs inside it, exposed. 8 prefetched
    all-gathers per step run under compute with jitter, and 4 reduce-scatters take the same time everywhere."""
    rng = random.Random(5)
    traces = [Trace(off) for off in offsets]
    for s in range(2):
        base = 30_000.0 * s
        end_of_first = base + 5 + 10 + LATE_US + 40 + 5 + 5 + TRANSFER_US  # the late rank's first all-gather ends
        for r, t in enumerate(traces):
            loader = 40 + (LATE_US if r == late else 0.0)
            t.frame("/work/train.py(30): main", base - 100, 29_000)  # the training loop: encloses the step
            t.step(s + 1, base, 28_000)
            t.frame("/usr/lib/python3.10/site-packages/torch/profiler/profiler.py(720): step", base + 1, 3)
            t.frame("/work/train.py(52): next_batch", base + 5, loader + 10)
            t.frame(LOADER, base + 10, loader)
            t.frame(f"{SITE}(1328): _next_data", base + 11, loader - 2)
            first = base + 5 + loader + 10 + 5  # the first GPU launch
            t.gpu(AG, first, first + 5, end_of_first - (first + 5))
            host, g = first + 10, end_of_first
            for _ in range(8):
                t.gpu(GEMM, host, g, 400)
                t.gpu(AG, host + 1, g + 10, 100 + rng.randint(0, 10))
                host, g = host + 5, g + 400
            for _ in range(4):
                t.gpu(GEMM, host, g, 300)
                t.gpu(RS, host + 1, g + 300, 200)
                host, g = host + 5, g + 500
    return traces


def gpu_straggler(slow: int = 1) -> list[Trace]:
    """Rank `slow` computes 1300 µs instead of 1000 before each of 5 all-reduces per step (1500 µs per step);
    the others wait 300 µs in each. Every rank's step starts with a device sync (a synchronized throughput
    timer) that on the slow rank blocks 2500 µs for its GPU, 100 µs elsewhere: the host waits for its own GPU,
    it is not late, though its raw lead-in to the first launch is 2400 µs longer than the others'."""
    traces = [Trace() for _ in range(RANKS)]
    for s in range(2):
        base = 20_000.0 * s
        for r, t in enumerate(traces):
            t.step(s + 1, base, 19_000)
            blocked = 2500 if r == slow else 100
            t.sync(base + 10, blocked)
            host, g = base + 10 + blocked + 5, base + 3000
            for _ in range(5):
                compute = 1300 if r == slow else 1000
                t.gpu(GEMM, host, g, compute)
                t.gpu(AR, host + 1, g + compute, 1500 - compute)
                host, g = host + 5, g + 1500
    return traces


# --------------------------------------------------------------------------------------------- the tests


def test_partial_straggler_is_found_at_the_reduce_scatters_despite_jitter_only_all_gathers(tmp_path: Path) -> None:
    f = straggler(write(tmp_path, partial_straggler()))
    assert f is not None and f.ranks == [3] and f.evidence["rank"] == 3
    rs, ag = f.evidence["by_kind"]["reduce_scatter"], f.evidence["by_kind"]["all_gather"]
    assert rs["telling"] and not ag["telling"]
    assert (rs["collectives"], rs["informative"], rs["last_to_arrive"]) == (12, 12, 12)
    assert rs["others_exposed_wait_us_per_step"] == 1800.0 and rs["own_wait_us_per_step"] == 0.0
    assert ag["collectives"] == 48 and ag["others_exposed_wait_us_per_step"] == 0.0  # hidden under compute
    # the old vote, last to arrive at most collectives, fails: the jitter-only all-gathers outvote
    assert ag["last_to_arrive"] + rs["last_to_arrive"] < (ag["informative"] + rs["informative"]) / 2
    assert f.evidence["late_on"] == "gpu"
    assert f.evidence["extra_compute_us_per_step"] == 1800.0
    assert f.evidence["compute_us_per_step"] == {"rank": 9600.0, "others_median": 7800.0}
    assert f.cost_us == 1800.0  # 6 reduce-scatters x 300 µs more compute before each
    assert "12 of 12 reduce-scatters" in f.why and "9600 µs vs 7800 µs" in f.why and "thermals" in f.why


def test_late_host_is_found_with_the_data_loader_frames(tmp_path: Path) -> None:
    f = straggler(write(tmp_path, host_straggler()))
    assert f is not None and f.ranks == [2] and f.title == "Rank 2 is a straggler (late on the host)"
    ev = f.evidence
    assert ev["late_on"] == "host"
    assert ev["extra_compute_us_per_step"] == 0.0  # its GPU does the same work
    # lead-in: 5 µs, the user frame around the loader (10 µs more than it) and 5 µs to the launch
    assert ev["host_gap_us_per_step"] == {"rank": LATE_US + 60, "others_median": 60.0}
    assert ev["host_gap_frames"][0] == {"frame": "torch/utils/data/dataloader.py(628): __next__", "us_per_step": 8040.0}
    ag = ev["by_kind"]["all_gather"]
    assert ag["telling"] and ag["collectives"] == 18 and ag["last_share_of_spread"] > 0.99
    assert ag["others_exposed_wait_us_per_step"] == LATE_US  # each step's first all-gather
    assert ag["last_to_arrive"] < ag["informative"] / 2  # by count, the old vote, it is not last at most
    assert f.cost_us == LATE_US  # the others' exposed waiting: its extra compute (0) explains nothing
    assert not ev["by_kind"]["reduce_scatter"]["telling"]
    assert "torch/utils/data/dataloader.py(628): __next__ (8040 µs)" in f.why
    assert "num_workers" in f.why and "thermals" not in f.why


def test_gpu_slow_straggler_whose_host_waits_in_a_sync_is_slow_on_the_gpu(tmp_path: Path) -> None:
    f = straggler(write(tmp_path, gpu_straggler()))
    assert f is not None and f.ranks == [1] and f.evidence["late_on"] == "gpu"
    assert f.evidence["extra_compute_us_per_step"] == 1500.0 and f.cost_us == 1500.0
    # the sync's 2500 µs are the host waiting for its own GPU: not counted in the lead-in
    assert f.evidence["host_gap_us_per_step"] == {"rank": 15.0, "others_median": 15.0}
    ar = f.evidence["by_kind"]["all_reduce"]
    assert (ar["collectives"], ar["last_to_arrive"], ar["others_exposed_wait_us_per_step"]) == (10, 10, 1500.0)
    assert "6500 µs vs 5000 µs" in f.why and "clocks, thermals, power" in f.why


def test_a_subsample_of_the_world_names_no_straggler(tmp_path: Path) -> None:
    # the same traces as a sub-sample of an 8-rank job: the ranks here may wait for one that is not
    traces = gpu_straggler()
    for rank, t in enumerate(traces):
        write_trace(tmp_path, f"rank{rank}.trace.json.gz", t.events, rank=rank, world_size=8)
    assert straggler(tmp_path) is None
    assert straggler(write(tmp_path / "whole", traces)) is not None


@pytest.mark.symptom_without_cause("straggler")
def test_waiting_without_a_rank_that_causes_it_is_no_straggler(tmp_path: Path) -> None:
    # every all-reduce has a large spread (500-1500 µs), but the last to arrive is a different rank at random
    rng = random.Random(3)
    traces = [Trace() for _ in range(RANKS)]
    for s in range(2):
        base = 100_000.0 * s
        for t in traces:
            t.step(s + 1, base, 90_000)
        g = base + 100
        for i in range(20):
            last = rng.randrange(RANKS)
            waits = [0.0 if r == last else float(rng.randint(500, 1500)) for r in range(RANKS)]
            for r, t in enumerate(traces):
                t.gpu(GEMM, base + 10 + 5 * i, g, 1000 + 1500 - waits[r])
                t.gpu(AR, base + 11 + 5 * i, g + 2500 - waits[r], 200 + waits[r])
            g += 2700
    folder = write(tmp_path, traces)
    assert straggler(folder) is None
    report = analyze(folder, jobs=1)
    assert all(r.collectives["all_reduce"].exposed_us > 10_000 for r in report.ranks)  # the symptom is there


def test_a_slow_network_that_every_rank_waits_for_is_no_straggler(tmp_path: Path) -> None:
    # every collective takes 5000 µs, exposed, on every rank, give or take 1 µs
    rng = random.Random(7)
    traces = [Trace() for _ in range(RANKS)]
    for s in range(2):
        base = 60_000.0 * s
        for t in traces:
            t.step(s + 1, base, 55_000)
            g = base + 100
            for i in range(8):
                t.gpu(GEMM, base + 10 + 5 * i, g, 1000)
                t.gpu(AR if i % 2 else RS, base + 11 + 5 * i, g + 1000, 5000 + rng.randint(0, 1))
                g += 6000
    assert straggler(write(tmp_path, traces)) is None


@pytest.mark.parametrize("build", [partial_straggler, host_straggler], ids=["partial", "host"])
def test_clock_offsets_between_nodes_change_nothing(tmp_path: Path, build: Any) -> None:
    same = straggler(write(tmp_path / "same", build()))
    shifted = straggler(write(tmp_path / "shifted", build(offsets=(0.0, 0.0, 5000.0, 5000.0))))
    assert same is not None and shifted is not None
    assert shifted == same  # rank, cost, evidence and text


def test_summaries_carry_the_host_lead_in_and_give_the_same_finding(tmp_path: Path) -> None:
    traces = write(tmp_path / "traces", host_straggler())
    new, old = tmp_path / "summaries", tmp_path / "old-summaries"
    new.mkdir()
    old.mkdir()
    for rank in range(RANKS):
        report = summarize(str(traces / f"rank{rank}.trace.json.gz"))
        text = JsonRenderer(digits=None).render(report)
        again = Report.from_dict(json.loads(text))
        assert again.to_dict() == report.to_dict()  # the new fields round-trip
        sig = again.collective_signatures[str(rank)]  # type: ignore[index]
        assert sig.host_gap_us == (LATE_US + 60 if rank == 2 else 60.0)
        assert sig.host_gap_frames == ["torch/utils/data/dataloader.py(628): __next__"]
        assert sig.host_gap_frame_us == [8040.0 if rank == 2 else 40.0]
        (new / f"rank{rank}.summary.json").write_text(text)
        doc = json.loads(text)  # a summary written before the lead-in was measured
        for key in ("host_gap_us", "host_gap_frames", "host_gap_frame_us"):
            del doc["collective_signatures"][str(rank)][key]
        sig = Report.from_dict(doc).collective_signatures[str(rank)]  # type: ignore[index]
        assert sig.host_gap_us is None and sig.host_gap_frames == [] and sig.host_gap_frame_us == []
        (old / f"rank{rank}.summary.json").write_text(json.dumps(doc))
    from_summaries = straggler(new)
    assert from_summaries is not None and from_summaries == straggler(traces)
    # without the lead-in the rank is still found, at the same cost, but nothing says where it is late
    from_old = straggler(old)
    assert from_old is not None and from_old.ranks == [2] and from_old.cost_us == LATE_US
    assert from_old.evidence["late_on"] is None and from_old.evidence["host_gap_us_per_step"] is None
    assert "does not show what makes it late" in from_old.why


def test_dlrm_straggler_is_founded_by_its_send_recvs_and_its_trace_does_not_say_why(shared_traces: Path) -> None:
    # the raw events: per rank, each NCCL kernel's duration by kind in issue order, and its per-step compute
    import gzip

    durations: dict[int, dict[str, list[float]]] = {}
    compute: dict[int, float] = {}
    for path in sorted((shared_traces / "dlrm-8rank-v100").glob("worker*.json.gz")):
        with gzip.open(path, "rt") as fh:
            doc = json.load(fh)
        rank = doc["distributedInfo"]["rank"]
        kernels = sorted((e for e in doc["traceEvents"] if e.get("cat") == "kernel"), key=lambda e: e["ts"])
        nccl = [e for e in kernels if "nccl" in e["name"].lower()]
        durations[rank] = {
            kind: [e["dur"] for e in nccl if marker in e["name"]]
            for kind, marker in (("send_recv", "SendRecv"), ("all_reduce", "AllReduce"))
        }
        compute[rank] = sum(e["dur"] for e in kernels if "nccl" not in e["name"].lower())
    sr = list(zip(*(durations[r]["send_recv"] for r in sorted(durations)), strict=True))
    shortest = [min(range(len(c)), key=c.__getitem__) for c in sr]
    assert shortest[:4] == [7] * 4 and shortest[4] != 7  # last to arrive at the first 4 of 5 send/recvs
    f = straggler(shared_traces / "dlrm-8rank-v100")
    assert f is not None and f.ranks == [7]
    kind = f.evidence["by_kind"]["all_to_all"]  # SendRecv kernels launched inside nccl:all_to_all
    assert (kind["collectives"], kind["last_to_arrive"], kind["telling"]) == (5, 4, True)
    waits = sorted(sum(c[r] - min(c) for c in sr) for r in range(8) if r != 7)
    assert kind["others_wait_us_per_step"] == waits[len(waits) // 2]  # one step; median of the other 7
    assert kind["own_wait_us_per_step"] == sum(c[7] - min(c) for c in sr)
    assert not f.evidence["by_kind"]["all_reduce"]["telling"]  # there ranks 4 and 5 arrive last
    # its compute is the median's and its host's lead-in into the step typical: neither GPU nor host in the trace
    assert f.evidence["late_on"] is None
    assert abs(f.evidence["extra_compute_us_per_step"]) < 0.01 * f.cost_us
    others = sorted(v for r, v in compute.items() if r != 7)
    assert abs(compute[7] - others[len(others) // 2]) < 0.02 * compute[7]  # the raw kernels say the same
    assert "does not show what makes it late" in f.why and "thermals" not in f.why
    assert f.cost_us == f.evidence["others_wait_us_per_step"]["median"]
