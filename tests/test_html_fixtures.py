"""Hand-built report documents (docs/report-schema.md) and timelines for the HTML and gate tests.

Imported by tests/test_html*.py, tests/test_gate*.py and tests/test_browser.py; the one test here checks that
the fixtures follow the schema's required keys, so that the renderers are tested against the real contract.
"""

from __future__ import annotations

import random

KINDS = ("all", "reduce_scatter", "all_gather", "all_reduce", "all_to_all", "send_recv", "broadcast", "other")
XSS_SCRIPT = "</script><script>alert(1)</script>"
XSS_IMG = "<img src=x onerror=alert(1)>"


def split(time_us: float = 0.0, overlap: float | None = None, count: int | None = None) -> dict:
    """One SPLIT; `overlap` is the hidden fraction of `time_us`."""
    if not time_us:
        return {"count": count or 0, "time_us": 0.0, "overlapped_us": 0.0, "exposed_us": 0.0, "overlap": None}
    hidden = time_us * (overlap or 0.0)
    return {
        "count": count if count is not None else max(1, int(time_us // 500)),
        "time_us": time_us,
        "overlapped_us": hidden,
        "exposed_us": time_us - hidden,
        "overlap": hidden / time_us,
    }


def collectives(
    rs: tuple[float, float] = (0, 0), ag: tuple[float, float] = (0, 0), ar: tuple[float, float] = (0, 0)
) -> dict:
    """COLLECTIVES from (time_us, overlap) for reduce-scatter, all-gather and all-reduce."""
    out = {k: split() for k in KINDS}
    out["reduce_scatter"], out["all_gather"], out["all_reduce"] = split(*rs), split(*ag), split(*ar)
    parts = [out["reduce_scatter"], out["all_gather"], out["all_reduce"]]
    time = sum(p["time_us"] for p in parts)
    hidden = sum(p["overlapped_us"] for p in parts)
    out["all"] = {
        "count": sum(p["count"] for p in parts),
        "time_us": time,
        "overlapped_us": hidden,
        "exposed_us": time - hidden,
        "overlap": hidden / time if time else None,
    }
    return out


def make_rank(
    rank: int,
    overlap: float = 0.7,
    compute_us: float = 80_000.0,
    steps: int = 2,
    comm_us: float = 30_000.0,
    source: str | None = None,
    host: str | None = None,
) -> dict:
    """One RANK with `steps` equal steps; reduce-scatter is less hidden than all-gather."""
    rs_o, ag_o = max(overlap - 0.15, 0.0), min(overlap + 0.1, 1.0)
    coll = collectives(rs=(comm_us * 0.4, rs_o), ag=(comm_us * 0.6, ag_o))
    exposed = coll["all"]["exposed_us"]
    step_time = compute_us + exposed + 2_000.0
    step_list = []
    for i in range(steps):
        sc = collectives(rs=(comm_us * 0.4 / steps, rs_o), ag=(comm_us * 0.6 / steps, ag_o))
        step_list.append(
            {
                "step": 10 + i,
                "start_us": 1e6 + i * step_time / steps,
                "duration_us": step_time / steps,
                "cpu_duration_us": step_time / steps * 0.9,
                "compute_us": compute_us / steps,
                "exposed_share": sc["all"]["exposed_us"] / (step_time / steps),
                "collectives": sc,
                "memcpy": {"count": 2, "time_us": 40.0, "exposed_us": 10.0},
                "memset": {"count": 1, "time_us": 5.0, "exposed_us": 0.0},
            }
        )
    return {
        "rank": rank,
        "source": source or f"traces/rank{rank}.trace.json.gz",
        "world_size": None,
        "backend": "nccl",
        "host": host or f"node-{rank // 8}",
        "lanes": "gpu",
        "span_us": step_time,
        "busy_us": step_time - 2_000.0,
        "compute_us": compute_us,
        "idle_us": 2_000.0,
        "step_time_us": step_time,
        "exposed_share": exposed / step_time,
        "collectives": coll,
        "memcpy": {"count": 4, "time_us": 80.0, "exposed_us": 20.0},
        "memset": {"count": 2, "time_us": 10.0, "exposed_us": 0.0},
        "streams": [
            {
                "stream": 7,
                "kernels": 400,
                "busy_us": compute_us,
                "classes": {"compute": 400, "comm": 0, "memcpy": 4, "memset": 2},
            },
            {
                "stream": 24,
                "kernels": 60,
                "busy_us": comm_us,
                "classes": {"compute": 0, "comm": 60, "memcpy": 0, "memset": 0},
            },
        ],
        "steps": step_list,
        "notes": [],
    }


def summarize(ranks: list[dict]) -> dict:
    """SUMMARY over ranks (min/median/max and worst_rank), as docs/metrics.md defines it."""
    import statistics

    def stat(values: list[tuple[int, float]], worst_high: bool) -> dict:
        vals = [v for _, v in values]
        worst = (max if worst_high else min)(values, key=lambda p: p[1])[0]
        return {"min": min(vals), "median": statistics.median(vals), "max": max(vals), "worst_rank": worst}

    metrics = {}
    for kind in KINDS:
        ov = [
            (r["rank"], r["collectives"][kind]["overlap"])
            for r in ranks
            if r["collectives"][kind]["overlap"] is not None
        ]
        if ov:
            metrics[f"{kind}.overlap"] = stat(ov, False)
            metrics[f"{kind}.exposed_us"] = stat(
                [(r["rank"], r["collectives"][kind]["exposed_us"]) for r in ranks], True
            )
    for key in ("exposed_share", "idle_us", "compute_us", "span_us"):
        vals = [(r["rank"], r[key]) for r in ranks if r[key] is not None]
        if vals:
            metrics[key] = stat(vals, key != "compute_us")
    return {"ranks": len(ranks), "metrics": metrics}


def make_finding(rule: str = "reduce-scatter-deferred", cost_us: float = 4_200.0, **kw) -> dict:
    finding = {
        "rule": rule,
        "severity": "critical",
        "title": "Reduce-scatter runs after the last backward kernel",
        "why": "reduce_bucket_size (500M) is larger than the model's gradients: one flush at the end of backward",
        "cost_us": cost_us,
        "ranks": [0, 1, 2, 3],
        "steps": [10, 11],
        "evidence": {
            "last_backward_kernel_end_us": 1234.5,
            "first_reduce_scatter_us": 1300.0,
            "call_site": "deepspeed/runtime/zero/stage3.py:1234 reduce_independent_p_g_buckets",
            "buckets": [{"size": 500000000, "exposed_us": 4200.0}],
        },
        "fix": {
            "config": {"zero_optimization.reduce_bucket_size": 50000000, "zero_optimization.overlap_comm": True},
            "env": {"CUDA_DEVICE_MAX_CONNECTIONS": None, "NCCL_ALGO": "Ring"},
            "upgrade": "deepspeed>=0.14.3",
        },
    }
    finding.update(kw)
    return finding


def make_report(
    n_ranks: int = 4,
    overlaps: list[float] | None = None,
    findings: list[dict] | None = None,
    errors: list[dict] | None = None,
    compute: list[float] | None = None,
) -> dict:
    """A whole `overlapcheck.report/1` document."""
    overlaps = overlaps or [0.7 - 0.05 * (i % 3) for i in range(n_ranks)]
    compute = compute or [80_000.0] * n_ranks
    ranks = [make_rank(i, overlap=overlaps[i], compute_us=compute[i]) for i in range(n_ranks)]
    return {
        "schema": "overlapcheck.report/1",
        "tool": {"name": "overlapcheck", "version": "0.1.0"},
        "run": None,
        "ranks": ranks,
        "summary": summarize(ranks),
        "findings": [make_finding()] if findings is None else findings,
        "findings_explain_share": 0.8,
        "errors": errors or [],
    }


def make_timeline(
    step: int = 10, n_compute: int = 300, n_comm: int = 40, seed: int = 0, kernel_name: str | None = None
) -> dict:
    """A timeline (the `timelines` contract of the HTML renderer) of one step on three lanes."""
    rng = random.Random(seed)
    names = [
        "ampere_fp16_s16816gemm_fp16_256x128_ldg8_f2f_stages_64x3_tn",
        "vectorized_elementwise_kernel",
        "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
        "Memcpy DtoD (Device -> Device)",
    ]
    if kernel_name is not None:
        names.append(kernel_name)
    events, t = [], 0.0
    for i in range(n_compute):
        dur = rng.uniform(20, 400)
        name = len(names) - 1 if kernel_name is not None and i == 5 else rng.choice([0, 1])
        events.append([0, t, dur, "compute", name])
        t += dur + rng.uniform(0, 30)
    end = t
    comm_t, exposed = 0.0, []
    for i in range(n_comm):
        dur = rng.uniform(100, 900)
        rs = i >= n_comm // 2
        events.append([1, comm_t, dur, "comm:reduce_scatter" if rs else "comm:all_gather", 2 if rs else 3])
        comm_t += dur + rng.uniform(50, 500)
    events.append([1, end + 10.0, 1500.0, "comm:reduce_scatter", 2])
    exposed.append([end + 10.0, end + 1510.0])
    for i in range(6):
        events.append([2, i * end / 6, 30.0, "memcpy", 4])
    return {
        "step": step,
        "t0": 1.7e12,
        "lanes": [
            {"id": 0, "label": "stream 7", "kind": "compute"},
            {"id": 1, "label": "stream 24", "kind": "comm"},
            {"id": 2, "label": "stream 9", "kind": "memcpy"},
        ],
        "events": events,
        "names": names,
        "exposed": exposed,
    }


def test_fixture_follows_schema():
    """The fixture report has every key docs/report-schema.md lists, so renderer tests use the real contract."""
    report = make_report(3)
    assert set(report) >= {"schema", "tool", "run", "ranks", "summary", "findings", "findings_explain_share", "errors"}
    rank = report["ranks"][0]
    assert set(rank) >= {
        "rank",
        "source",
        "world_size",
        "backend",
        "host",
        "lanes",
        "span_us",
        "busy_us",
        "compute_us",
        "idle_us",
        "step_time_us",
        "exposed_share",
        "collectives",
        "memcpy",
        "memset",
        "streams",
        "steps",
        "notes",
    }
    assert set(rank["collectives"]) == set(KINDS)
    assert set(rank["steps"][0]) >= {
        "step",
        "start_us",
        "duration_us",
        "cpu_duration_us",
        "compute_us",
        "exposed_share",
        "collectives",
        "memcpy",
        "memset",
    }
    all_split = rank["collectives"]["all"]
    assert abs(all_split["time_us"] - all_split["overlapped_us"] - all_split["exposed_us"]) < 1e-6
    assert report["summary"]["metrics"]["all.overlap"]["worst_rank"] == 2
