"""The exact expected metrics of a simulated set, computed from the simulator's own intervals as
written in the trace (rounded ts and dur), following docs/metrics.md. Independent of
overlapcheck.analysis on purpose: it has its own small interval code."""

from __future__ import annotations

from typing import Any

from overlapcheck.simulate.sim import RankRun, SimResult

BACKWARD_OP = "autograd::engine::evaluate_function"
PHASES = ("forward", "backward", "optimizer")
KINDS = ("all", "reduce_scatter", "all_gather", "all_reduce", "all_to_all", "send_recv", "broadcast", "other")
Intervals = list[tuple[float, float]]


def merge(intervals: Intervals) -> Intervals:
    """Sorted, non-overlapping union of half-open intervals."""
    out: Intervals = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            if e > out[-1][1]:
                out[-1] = (out[-1][0], e)
        else:
            out.append((s, e))
    return out


def length(merged: Intervals) -> float:
    return sum(e - s for s, e in merged)


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two merged interval lists."""
    out: Intervals = []
    i = j = 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """a minus b, both merged."""
    out: Intervals = []
    j = 0
    for s, e in a:
        cur = s
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < e:
            out.append((cur, e))
    return out


def _r(x: float) -> float:
    return round(x, 4)


def split(comm: list[tuple[str, float, float]], compute: Intervals) -> dict[str, dict[str, Any]]:
    """The COLLECTIVES object: count/time/overlapped/exposed/overlap per kind and `all`."""
    out = {}
    for kind in KINDS:
        ivs = [(s, e) for k, s, e in comm if kind == "all" or k == kind]
        merged = merge(ivs)
        time = length(merged)
        over = length(intersect(merged, compute))
        out[kind] = {
            "count": len(ivs),
            "time_us": _r(time),
            "overlapped_us": _r(over),
            "exposed_us": _r(time - over),
            "overlap": (over / time) if time > 0 else None,
        }
    return out


def copies(ivs: Intervals, compute: Intervals, comm_all: Intervals) -> dict[str, Any]:
    merged = merge(ivs)
    exposed = subtract(subtract(merged, compute), comm_all)
    return {"count": len(ivs), "time_us": _r(length(merged)), "exposed_us": _r(length(exposed))}


def phases(
    acts: list[tuple[str, str, float, float, float]], compute: Intervals, backward_ops: Intervals
) -> dict[str, Any]:
    """forward / backward / optimizer: issued before, inside, after the step's backward CPU window."""
    if not backward_ops:
        return {}
    lo, hi = min(s for s, _ in backward_ops), max(e for _, e in backward_ops)
    out = {}
    for name in PHASES:
        sel = [a for a in acts if (a[4] < lo, lo <= a[4] <= hi, a[4] > hi)[PHASES.index(name)]]
        out[name] = {
            "compute_us": _r(length(merge([(s, e) for c, _, s, e, _ in sel if c == "compute"]))),
            "collectives": split([(k, s, e) for c, k, s, e, _ in sel if c == "comm"], compute),
        }
    return out


def rank_truth(run: RankRun, source: str) -> dict[str, Any]:
    """The RANK fields of docs/report-schema.md for one simulated rank."""
    acts = []  # (cls, collective, start, end, launch ts) in trace time
    for op in run.gpu:
        ts, dur = run.span(op.start_time, op.end_time)
        launch = run.ts(op.launch_ts)
        acts.append((op.cls, op.collective or "", ts, ts + dur, launch))
    compute = merge([(s, e) for c, _, s, e, _ in acts if c == "compute"])
    comm = [(k, s, e) for c, k, s, e, _ in acts if c == "comm"]
    comm_all = merge([(s, e) for _, s, e in comm])
    autograd = [
        run.span(ev.ts, ev.ts + ev.dur) for ev in run.cpu if ev.cat == "cpu_op" and ev.name.startswith(BACKWARD_OP)
    ]
    steps: list[dict[str, Any]] = []
    marks = sorted(
        (run.span(ev.ts, ev.ts + ev.dur), ev.name)
        for ev in run.cpu
        if ev.cat == "user_annotation" and ev.name.startswith("ProfilerStep#")
    )
    owned = [[a for a in acts if ts <= a[4] <= ts + dur] for (ts, dur), _ in marks]
    in_steps = {id(a) for mine in owned for a in mine}
    # periods (docs/metrics.md): from the end of the GPU work of the step and every earlier one; the first step
    # with work starts at its first kernel
    first = next((mine for mine in owned if mine), [])
    end = min((a[2] for a in first if a[0] in ("compute", "comm")), default=min((a[2] for a in first), default=0.0))
    for ((ts, dur), name), mine in zip(marks, owned, strict=True):
        start = min((a[2] for a in mine), default=ts)
        duration = (max(a[3] for a in mine) - start) if mine else dur
        if first:
            period_start = end
            end = max([end, *(a[3] for a in mine)])
            period = end - period_start
        else:
            period_start, period = ts, dur
        colls = split([(k, s, e) for c, k, s, e, _ in mine if c == "comm"], compute)
        steps.append(
            {
                "step": int(name.split("#", 1)[1]),
                "start_us": _r(start),
                "duration_us": _r(duration),
                "cpu_duration_us": _r(dur),
                "compute_us": _r(length(merge([(s, e) for c, _, s, e, _ in mine if c == "compute"]))),
                "exposed_share": (colls["all"]["exposed_us"] / period)
                if period > 0 and colls["all"]["count"]
                else None,
                "collectives": colls,
                "memcpy": copies([(s, e) for c, _, s, e, _ in mine if c == "memcpy"], compute, comm_all),
                "memset": copies([(s, e) for c, _, s, e, _ in mine if c == "memset"], compute, comm_all),
                "phases": phases(mine, compute, [(a, a + d) for a, d in autograd if ts <= a <= ts + dur]),
                "period_start_us": _r(period_start),
                "period_us": _r(period),
            }
        )
    span = (max(a[3] for a in acts) - min(a[2] for a in acts)) if acts else 0.0
    busy = length(merge([(s, e) for _, _, s, e, _ in acts]))
    step_time = sum(s["period_us"] for s in steps) if steps else span
    colls = split(comm, compute)
    step_exposed = sum(s["collectives"]["all"]["exposed_us"] for s in steps) if steps else colls["all"]["exposed_us"]
    first_cpu = marks[0][0][0] if marks else 0.0
    outside = [a for a in acts if id(a) not in in_steps]
    before = [a for a in outside if a[4] < first_cpu]
    return {
        "rank": run.rank,
        "source": source,
        "world_size": None,
        "backend": "nccl",
        "host": f"node-{run.node}",
        "lanes": "gpu",
        "span_us": _r(span),
        "busy_us": _r(busy),
        "compute_us": _r(length(compute)),
        "idle_us": _r(span - busy),
        "step_time_us": _r(step_time),
        "exposed_share": (step_exposed / step_time) if step_time > 0 else None,
        "collectives": colls,
        "memcpy": copies([(s, e) for c, _, s, e, _ in acts if c == "memcpy"], compute, comm_all),
        "memset": copies([(s, e) for c, _, s, e, _ in acts if c == "memset"], compute, comm_all),
        "steps": steps,
        "before_first_step": _outside(before, compute, comm_all) if steps else None,
        "outside_steps": _outside(outside, compute, comm_all) if steps else None,
    }


def _outside(
    acts: list[tuple[str, str, float, float, float]], compute: Intervals, comm_all: Intervals
) -> dict[str, Any]:
    """The OUTSIDE object (docs/report-schema.md) of the activities of no step."""
    return {
        "count": len(acts),
        "busy_us": _r(length(merge([(s, e) for _, _, s, e, _ in acts]))),
        "compute_us": _r(length(merge([(s, e) for c, _, s, e, _ in acts if c == "compute"]))),
        "collectives": split([(k, s, e) for c, k, s, e, _ in acts if c == "comm"], compute),
        "memcpy": copies([(s, e) for c, _, s, e, _ in acts if c == "memcpy"], compute, comm_all),
        "memset": copies([(s, e) for c, _, s, e, _ in acts if c == "memset"], compute, comm_all),
    }


def module_truth(run: RankRun) -> dict[str, dict[str, Any]]:
    """Per module, collective kind and phase (docs/metrics.md, Per module), keyed `<module>|<kind>|<phase>` (an
    empty module or phase: none): the collectives that serve it, by the simulator's own record of which modules
    each one serves (the gathered module; a bucket's modules, its time split evenly), their time, and the
    hidden and exposed µs against the rank's compute."""
    acts = []
    for op in run.gpu:
        ts, dur = run.span(op.start_time, op.end_time)
        acts.append((op, ts, ts + dur, run.ts(op.launch_ts)))
    compute = merge([(s, e) for op, s, e, _ in acts if op.cls == "compute"])
    autograd = [
        run.span(ev.ts, ev.ts + ev.dur) for ev in run.cpu if ev.cat == "cpu_op" and ev.name.startswith(BACKWARD_OP)
    ]
    marks = sorted(
        run.span(ev.ts, ev.ts + ev.dur)
        for ev in run.cpu
        if ev.cat == "user_annotation" and ev.name.startswith("ProfilerStep#")
    )
    windows = []
    for ts, dur in marks:
        inside = [(a, a + d) for a, d in autograd if ts <= a <= ts + dur]
        windows.append((min(s for s, _ in inside), max(e for _, e in inside)) if inside else None)
    out: dict[str, dict[str, Any]] = {}
    for op, s, e, launch in acts:
        if op.cls != "comm":
            continue
        phase = ""
        for (ts, dur), window in zip(marks, windows, strict=True):
            if ts <= launch <= ts + dur:
                if window is not None:
                    lo, hi = window
                    phase = PHASES[0] if launch < lo else PHASES[1] if launch <= hi else PHASES[2]
                break
        mods = op.modules or ("",)
        hidden = length(intersect([(s, e)], compute)) if e > s else 0.0
        for m in mods:
            row = out.setdefault(f"{m}|{op.collective}|{phase}", {"count": 0, "time_us": 0.0, "hidden_us": 0.0})
            row["count"] += 1
            row["time_us"] += (e - s) / len(mods)
            row["hidden_us"] += hidden / len(mods)
    for row in out.values():
        row["exposed_us"] = _r(row["time_us"] - row["hidden_us"])
        row["time_us"], row["hidden_us"] = _r(row["time_us"]), _r(row["hidden_us"])
    return dict(sorted(out.items()))


def set_truth(result: SimResult, sources: list[str]) -> list[dict[str, Any]]:
    ranks = []
    for run, source in zip(result.ranks, sources, strict=True):
        truth = rank_truth(run, source)
        truth["world_size"] = result.cfg.world_size
        ranks.append(truth)
    return ranks


def mean_step_time(result: SimResult) -> float:
    """Mean over ranks of the step period (sim.step_period): the cost unit of causes."""
    return sum(r.period_us for r in result.ranks) / len(result.ranks)


def _bus_factor(kind: str, n: int) -> float:
    """nccl-tests PERFORMANCE.md: busbw = algbw x 2(n-1)/n (all-reduce), x (n-1)/n (reduce-scatter, all-gather)."""
    return 2.0 * (n - 1) / n if kind == "all_reduce" else (n - 1) / n


def bandwidth_truth(result: SimResult) -> dict[str, Any]:
    """Per collective kind, over the collectives issued inside a profiled step on every rank of their group: the
    bytes per step and rank (mean over ranks), and busbw = size x factor / transfer time, where the transfer time
    is the shortest duration of the collective over its ranks as written in the traces (GB/s = 1e9 bytes/s);
    median, min and max over the collectives."""
    seen: dict[tuple[str, int], tuple[Any, list[float]]] = {}
    per_rank_bytes: dict[str, list[float]] = {}
    for run in result.ranks:
        marks = sorted(
            run.span(ev.ts, ev.ts + ev.dur)
            for ev in run.cpu
            if ev.cat == "user_annotation" and ev.name.startswith("ProfilerStep#")
        )
        mine: dict[str, float] = {}
        for op in run.gpu:
            if op.cls != "comm" or op.coll is None:
                continue
            launch = run.ts(op.launch_ts)
            if not any(ts <= launch <= ts + dur for ts, dur in marks):
                continue
            _, dur = run.span(op.start_time, op.end_time)
            seen.setdefault((op.coll.pg, op.coll.seq), (op.coll, []))[1].append(dur)
            mine[op.coll.kind] = mine.get(op.coll.kind, 0.0) + op.coll.nbytes
        for kind, total in mine.items():
            per_rank_bytes.setdefault(kind, []).append(total / max(1, len(marks)))
    out: dict[str, Any] = {}
    for kind in sorted(per_rank_bytes):
        bws = sorted(
            c.nbytes * _bus_factor(kind, c.size) / min(durs) * 1e6 / 1e9
            for c, durs in seen.values()
            if c.kind == kind and len(durs) == c.size and min(durs) > 0 and c.size > 1 and c.nbytes > 0
        )
        if not bws:
            continue
        mid = len(bws) // 2
        out[kind] = {
            "collectives": len(bws),
            "bytes_per_step": round(sum(per_rank_bytes[kind]) / len(per_rank_bytes[kind]), 3),
            "busbw_gbps": bws[mid] if len(bws) % 2 else (bws[mid - 1] + bws[mid]) / 2,
            "busbw_min_gbps": bws[0],
            "busbw_max_gbps": bws[-1],
        }
    return out
