"""Bytes, bus bandwidth and hideability (docs/metrics.md, Bandwidth and Hideability) and the bandwidth-bound rule
(docs/rules.md): against hand computations on a real trace and against the simulator's truth."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest
from builders import SimulatedSets, kernel, launch, write_trace
from click.testing import CliRunner

from overlapcheck.analysis.bandwidth import bus_factor, nvlink_peak
from overlapcheck.cli import main
from overlapcheck.diagnose.rules.bandwidth import disabled_transports, zero_pp_settings
from overlapcheck.errors import UserError
from overlapcheck.job import JobContext, parse_network
from overlapcheck.model import JobBandwidth, JobKindBandwidth, Report
from overlapcheck.pipeline import analyze
from overlapcheck.simulate import generate

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"
NCCL_DATA = SHARED / "nccl-single-rank" / "nccl_data.json.gz"
SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
ELEMENT = {"Float": 4, "BFloat16": 2, "Half": 2, "Long": 8, "Int": 4, "Byte": 1}
SCHEDULE_KEYS = ("reduce_bucket_size", "prefetch_bucket_size", "overlap_comm", "synchronized", "comms_logger")


def test_bus_factor_follows_nccl_tests() -> None:
    assert bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert bus_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert bus_factor("all_gather", 32) == pytest.approx(31 / 32)
    assert bus_factor("broadcast", 8) == 1.0
    assert bus_factor("all_reduce", 1) == 0.0


@pytest.mark.skipif(not NCCL_DATA.exists(), reason="shared traces not present")
def test_busbw_on_a_real_trace_equals_the_hand_computation() -> None:
    """nccl_data (A100, NCCL 2.17.1, 2 ranks): every NCCL kernel carries In/Out msg nelems, dtype, Group size."""
    with gzip.open(NCCL_DATA) as fh:
        doc = json.loads(fh.read())
    hand: dict[str, list[float]] = {"all_reduce": [], "broadcast": []}
    for ev in doc["traceEvents"]:
        args = ev.get("args") or {}
        if ev.get("cat") != "kernel" or "In msg nelems" not in args or ev.get("dur", 0) <= 0:
            continue
        kind = {"allreduce": "all_reduce", "broadcast": "broadcast"}[args["Collective name"]]
        size = max(args["In msg nelems"], args["Out msg nelems"]) * ELEMENT[args["dtype"]]
        n = args["Group size"]
        factor = 2 * (n - 1) / n if kind == "all_reduce" else 1.0
        dur = (ev["ts"] + ev["dur"]) - ev["ts"]  # as the reader keeps it: start and end, in float64
        hand[kind].append(size / (dur * 1e-6) / 1e9 * factor)
    rank = analyze(NCCL_DATA).ranks[0]
    for kind, values in hand.items():
        got = rank.bandwidth[kind]
        assert got.count == len(values)
        assert got.group_size == 2
        assert got.busbw_gbps == pytest.approx(statistics.median(values), rel=1e-9)
        assert got.busbw_min_gbps == pytest.approx(min(values), rel=1e-9)
        assert got.busbw_max_gbps == pytest.approx(max(values), rel=1e-9)
        assert got.peak_gbps is None  # one trace: its group's placement on nodes is unknown, so no peak is guessed
    # the first all-reduce by hand: 6,637,568 floats in 2636.669 us, 2 ranks: busbw = algbw = 10.0696 GB/s
    first = 6637568 * 4 / 2636.669e-6 / 1e9
    assert first == pytest.approx(10.0696, abs=1e-4)
    assert min(hand["all_reduce"]) <= first <= max(hand["all_reduce"])


# These tests read the truth's bandwidth and the planted cause's cost, never the inherent costs or free_comm_us:
# only the cause is costed (1 + 1 simulations instead of 8). The 2x4 set is test_diagnose_presets.py's (the
# preset's own size and 2 steps), simulated once per session.
@pytest.fixture
def degraded_2x4(simulated: SimulatedSets) -> tuple[Path, dict]:
    return simulated.get("degraded-network", nodes=2, gpus_per_node=4, inherent_costs=False)


def test_busbw_equals_the_simulator_truth(degraded_2x4: tuple[Path, dict]) -> None:
    out, truth = degraded_2x4
    report = analyze(out, jobs=1)
    assert report.bandwidth is not None
    assert set(truth["bandwidth"]) <= set(report.bandwidth.kinds)
    for kind, want in truth["bandwidth"].items():
        got = report.bandwidth.kinds[kind]
        assert got.collectives == want["collectives"]
        assert got.bytes_per_step == pytest.approx(want["bytes_per_step"], rel=1e-9)
        assert got.busbw_gbps == pytest.approx(want["busbw_gbps"], rel=1e-9)
        assert got.busbw_min_gbps == pytest.approx(want["busbw_min_gbps"], rel=1e-9)
        assert got.busbw_max_gbps == pytest.approx(want["busbw_max_gbps"], rel=1e-9)
        assert got.scope == "inter-node"
        assert got.peak_gbps is None  # no --network: measured numbers only


def _bandwidth_bound(report: Report) -> list:
    return [f for f in report.findings if f.rule == "bandwidth-bound"]


def _assert_diagnosed(report: Report, truth: dict) -> None:
    top = report.findings[0]
    assert top.rule == "bandwidth-bound"
    cost = next(c["cost_us"] for c in truth["causes"] if c["rule"] == "bandwidth-bound")
    assert top.cost_us == pytest.approx(cost, rel=0.1)  # the floor vs the counterfactual (healthy network)
    assert top.evidence["floor_us_per_step"] >= 0.75 * (
        top.evidence["floor_us_per_step"] + top.evidence["schedulable_us_per_step"]
    )
    config = top.fix.config or {}
    assert config["zero_optimization.zero_quantized_weights"] is True
    assert config["zero_optimization.zero_quantized_gradients"] is True
    assert "zero_optimization.zero_hpz_partition_size" in config
    for f in report.findings:  # buckets and syncs are fine: nothing suggests changing them
        assert not any(k in key for key in (f.fix.config or {}) for k in SCHEDULE_KEYS), f.rule


def test_degraded_network_2x4_is_bandwidth_bound(degraded_2x4: tuple[Path, dict]) -> None:
    out, truth = degraded_2x4
    _assert_diagnosed(analyze(out, jobs=1), truth)


def test_degraded_network_4x8_is_bandwidth_bound(tmp_path: Path) -> None:
    truth = generate("degraded-network", tmp_path, steps=1, nodes=4, gpus_per_node=8, inherent_costs=False)
    _assert_diagnosed(analyze(tmp_path), truth)


@pytest.mark.symptom_without_cause("bandwidth-bound")
def test_healthy_is_not_bandwidth_bound(tmp_path: Path) -> None:
    generate("healthy", tmp_path, costs=False, steps=2, nodes=2, gpus_per_node=4)
    report = analyze(tmp_path, jobs=1)
    assert not _bandwidth_bound(report)
    assert report.bandwidth is not None and report.bandwidth.floor_us == 0.0


@pytest.mark.skipif(not (SAMPLES / "healthy").exists(), reason="sample traces not present")
def test_healthy_sample_is_not_bandwidth_bound() -> None:
    assert not _bandwidth_bound(analyze(SAMPLES / "healthy"))


def test_network_is_parsed_strictly() -> None:
    assert parse_network("4x200Gbps").node_gbps == pytest.approx(100.0)
    assert parse_network("4x200Gbps").per_gpu_gbps(8) == pytest.approx(12.5)
    assert parse_network("400Gbps").node_gbps == pytest.approx(50.0)
    assert parse_network("8x25GB/s").node_gbps == pytest.approx(200.0)
    for bad in ("", "fast", "4x", "0x200Gbps", "4x0Gbps", "200", "4x200gbps", "-1x2Gbps"):
        with pytest.raises(UserError):
            parse_network(bad)


def test_bad_network_is_one_line_and_exit_2(degraded_2x4: tuple[Path, dict]) -> None:
    out, _ = degraded_2x4
    result = CliRunner().invoke(main, ["analyze", str(out), "--network", "4xfast"])
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1 and "--network" in result.output


def test_stated_network_is_the_inter_node_peak(degraded_2x4: tuple[Path, dict]) -> None:
    out, _ = degraded_2x4
    result = CliRunner().invoke(main, ["analyze", str(out), "--network", "4x200Gbps", "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["bandwidth"]["network"]["per_gpu_gbps"] == pytest.approx(25.0)  # 100 GB/s per node / 4 GPUs
    assert doc["bandwidth"]["kinds"]["all_gather"]["peak_gbps"] == pytest.approx(25.0)
    assert doc["ranks"][0]["bandwidth"]["all_gather"]["peak_gbps"] == pytest.approx(25.0)
    top = doc["findings"][0]
    assert top["rule"] == "bandwidth-bound" and "network_checks" in top["evidence"]  # 7.6 of 25 GB/s
    assert Report.from_dict(doc).bandwidth is not None


def test_intra_node_peak_is_nvlink_of_the_gpu_model(tmp_path: Path) -> None:
    generate("healthy", tmp_path, costs=False, steps=1, nodes=1, gpus_per_node=2, gpu="A100")
    rank = analyze(tmp_path, jobs=1).ranks[0]
    bw = rank.bandwidth["all_gather"]
    assert bw.scope == "intra-node"
    assert bw.peak_gbps == 300.0 and "NVLink 3" in (bw.peak or "")
    assert nvlink_peak("NVIDIA H100 80GB HBM3") == (450.0, "NVLink 4 (NVIDIA H100 80GB HBM3), per GPU and direction")
    assert nvlink_peak("Tesla V100-SXM2-16GB") is None  # unknown model: no peak


def test_old_documents_still_load(degraded_2x4: tuple[Path, dict]) -> None:
    out, _ = degraded_2x4
    doc = analyze(out, jobs=1).to_dict()
    doc.pop("bandwidth")
    for rank in doc["ranks"]:
        rank.pop("bandwidth")
    report = Report.from_dict(doc)
    assert report.bandwidth is None and report.ranks[0].bandwidth == {}


# -- sizes from record_param_comms, scope from process-group ranks and run.json hosts ---------------------------


def _op(name: str, ts: float, dur: float, tid: int = 100, **args: object) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 100, "tid": tid, "ts": ts, "dur": dur, "args": args}


COMMS_ARGS = {"In msg nelems": 1_000_000, "Out msg nelems": 1_000_000, "dtype": "Float", "Group size": 2}


def test_sizes_come_from_the_record_param_comms_op_that_launched_the_kernel(tmp_path: Path) -> None:
    """torch < 2.2: the NCCL kernel has no size args; the record_param_comms op around its launch has them. The
    all-reduce's kernel names a child op of record_param_comms by External id; the broadcast's names it."""
    events = [
        _op("record_param_comms", 10, 20, **{"External id": 7, "Process Group Name": "0", **COMMS_ARGS}),
        _op("nccl:all_reduce", 12, 10, **{"External id": 8}),
        launch(14, corr=5),
        _op("record_param_comms", 40, 10, **{"External id": 9, **COMMS_ARGS, "In msg nelems": 500_000}),
        launch(45, corr=6),
        launch(60, corr=9),  # a kernel launched outside any record_param_comms keeps unknown sizes
        kernel(
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            100,
            100,
            corr=5,
            **{"External id": 8},
        ),
        kernel(
            "ncclDevKernel_Broadcast_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
            300,
            50,
            corr=6,
            **{"External id": 9},
        ),
        kernel("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 400, 50, corr=9),
    ]
    write_trace(tmp_path, "rank0.json", events, rank=0, world_size=2, gz=False)
    bw = analyze(tmp_path, jobs=1).ranks[0].bandwidth
    ar = bw["all_reduce"]
    assert ar.count == 1 and ar.group_size == 2 and ar.bytes_per_step == 4e6
    assert ar.algbw_gbps == pytest.approx(4e6 / 100e-6 / 1e9)  # 40 GB/s
    assert ar.busbw_gbps == pytest.approx(40.0 * 2 * 1 / 2)
    bc = bw["broadcast"]  # max(in, out) = 1e6 floats
    assert bc.count == 1 and bc.bytes_per_step == 4e6 and bc.busbw_gbps == pytest.approx(4e6 / 50e-6 / 1e9)
    assert "all_gather" not in bw


@pytest.mark.skipif(not NCCL_DATA.exists(), reason="shared traces not present")
def test_real_trace_without_kernel_sizes_gets_them_from_record_param_comms(tmp_path: Path) -> None:
    """nccl_data with the size args taken off its NCCL kernels (as torch < 2.2 writes them): the record_param_comms
    ops (which carry In/Out msg nelems, dtype, Group size) give the same bytes and busbw."""
    with gzip.open(NCCL_DATA) as fh:
        doc = json.loads(fh.read())
    keys = ("In msg nelems", "Out msg nelems", "dtype", "Group size", "Process Group Name", "In msg size")
    for ev in doc["traceEvents"]:
        if ev.get("cat") == "kernel" and "In msg nelems" in (ev.get("args") or {}):
            for key in keys:
                ev["args"].pop(key, None)
    stripped = tmp_path / "stripped.json"
    stripped.write_text(json.dumps(doc))
    want, got = analyze(NCCL_DATA).ranks[0].bandwidth, analyze(stripped).ranks[0].bandwidth
    assert set(got) == set(want) == {"all_reduce", "broadcast"}
    for kind in want:
        assert got[kind] == want[kind]


def _subgroup_trace(tmp_path: Path, run_hosts: dict[int, str] | None) -> Report:
    pg_config = [
        {"pg_name": "0", "pg_size": 4, "ranks": [0, 1, 2, 3]},
        {"pg_name": "1", "pg_size": 2, "ranks": [0, 1]},
        {"pg_name": "2", "pg_size": 2, "ranks": [0, 2]},
    ]
    info = {"backend": "nccl", "rank": 0, "world_size": 4, "pg_config": pg_config}
    args = {"In msg nelems": 1000, "Out msg nelems": 1000, "dtype": "Float"}
    events = [
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(x)", 100, 10, **args, **{"Process Group Name": "1"}),
        kernel("ncclDevKernel_AllGather_RING_LL(x)", 200, 10, **args, **{"Process Group Name": "2"}),
        kernel("ncclDevKernel_Broadcast_RING_LL(x)", 300, 10, **args, **{"Process Group Name": "0"}),
    ]
    write_trace(tmp_path, "rank0.json", events, rank=None, gz=False, distributedInfo=info)
    if run_hosts is not None:
        ranks = [{"rank": r, "host": h} for r, h in run_hosts.items()]
        (tmp_path / "run.json").write_text(json.dumps({"ranks": ranks}))
    return analyze(tmp_path, jobs=1)


def test_scope_of_a_process_group_from_its_ranks_and_the_run_hosts(tmp_path: Path) -> None:
    report = _subgroup_trace(tmp_path, {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"})
    bw = report.ranks[0].bandwidth
    assert bw["all_reduce"].group_size == 2 and bw["all_reduce"].scope == "intra-node"  # ranks 0, 1 on node-a
    assert bw["all_gather"].scope == "inter-node"  # ranks 0 (node-a), 2 (node-b)
    assert bw["broadcast"].group_size == 4 and bw["broadcast"].scope == "inter-node"  # the world, 2 nodes
    assert report.bandwidth is not None and report.bandwidth.kinds["all_reduce"].scope == "intra-node"


def test_scope_stays_unknown_without_the_hosts_of_the_group(tmp_path: Path) -> None:
    bw = _subgroup_trace(tmp_path, {0: "node-a", 2: "node-b"}).ranks[0].bandwidth  # rank 1's host unknown
    assert bw["all_reduce"].scope is None
    assert bw["all_gather"].scope == "inter-node"
    assert bw["broadcast"].scope is None  # the world's hosts are not all known


def _with_env(out: Path, env: dict[str, str]) -> dict:
    """The simulated job's ds_config.json with `env` as the job's recorded environment."""
    doc = json.loads((out / "ds_config.json").read_text())
    doc["_overlapcheck_job"] = {**doc.get("_overlapcheck_job", {}), "env": env}
    return doc


def test_a_disabled_transport_below_the_link_rate_is_the_fix(degraded_2x4: tuple[Path, dict]) -> None:
    # NCCL_IB_DISABLE=1 and the inter-node collectives run at 7.6 GB/s, under half the stated 25 GB/s per GPU: the
    # variable is the fix (unset), the ZeRO++ settings only after it; NCCL_SOCKET_IFNAME says nothing knowable
    out, _ = degraded_2x4
    env = {"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "eth0"}
    (cfg := out.parent / "ib-disabled.json").write_text(json.dumps(_with_env(out, env)))
    args = ["analyze", str(out), "--network", "4x200Gbps", "--format", "json", "--ds-config", str(cfg)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    top = json.loads(result.output)["findings"][0]
    assert top["rule"] == "bandwidth-bound"
    assert top["fix"]["env"] == {"NCCL_IB_DISABLE": None} and not top["fix"].get("config")
    (t,) = top["evidence"]["disabled_transports"]
    assert t["variable"] == "NCCL_IB_DISABLE" and t["scope"] == "inter-node" and t["link_gbps"] == 25.0
    assert t["share_of_link"] < 0.5 and top["why"].startswith("the job's environment sets NCCL_IB_DISABLE=1")
    assert "zero_optimization.zero_quantized_gradients" in top["evidence"]["after_transport_fix"]


@pytest.mark.parametrize(
    "env",
    [
        {"NCCL_IB_DISABLE": "1"},  # 7.6 GB/s is above half of the assumed 12.5 GB/s (no --network): not far below
        {"NCCL_P2P_DISABLE": "1"},  # an intra-node transport: the collectives that are slow cross nodes
        {"NCCL_IB_DISABLE": "0", "NCCL_SOCKET_IFNAME": "eth0"},  # nothing disabled; a slow NIC is not knowable
    ],
)
def test_a_transport_variable_without_slow_collectives_of_its_scope_is_no_fix(
    degraded_2x4: tuple[Path, dict], env: dict[str, str]
) -> None:
    out, _ = degraded_2x4
    (top,) = _bandwidth_bound(analyze(out, ds_config=_with_env(out, env), jobs=1))
    assert not top.fix.env and "disabled_transports" not in top.evidence
    assert top.fix.config and top.fix.config["zero_optimization.zero_quantized_gradients"] is True


def _job_bw(scope: str, busbw: float, peak: float | None) -> JobBandwidth:
    kind = JobKindBandwidth(9, 9e8, 1e4, 0.0, busbw, busbw, busbw, scope, peak, "NVLink 4" if peak else None)
    return JobBandwidth({"all_gather": kind, "reduce_scatter": kind}, {}, 1e4, 0.0)


@pytest.mark.parametrize(
    ("env", "scope", "busbw", "peak", "named"),
    [
        ({"NCCL_P2P_DISABLE": "1"}, "intra-node", 20.0, 450.0, "NCCL_P2P_DISABLE"),  # 4.4 % of NVLink 4
        ({"NCCL_P2P_LEVEL": "LOC"}, "intra-node", 20.0, 450.0, "NCCL_P2P_LEVEL"),
        ({"NCCL_SHM_DISABLE": "1"}, "intra-node", 20.0, 450.0, "NCCL_SHM_DISABLE"),
        ({"NCCL_NET": "Socket"}, "inter-node", 1.5, None, "NCCL_NET"),  # against the assumed 12.5 GB/s
        ({"NCCL_P2P_DISABLE": "1"}, "intra-node", 380.0, 450.0, None),  # near the link rate: changed nothing
        ({"NCCL_P2P_LEVEL": "NVL"}, "intra-node", 20.0, 450.0, None),  # NVLink still allowed
        ({"NCCL_NET": "IB"}, "inter-node", 1.5, None, None),
        ({"NCCL_P2P_DISABLE": "1"}, "inter-node", 1.5, None, None),  # the slow scope is not the one it disables
    ],
)
def test_disabled_transports_need_slow_collectives_of_their_scope(
    env: dict[str, str], scope: str, busbw: float, peak: float | None, named: str | None
) -> None:
    found = disabled_transports(_job_bw(scope, busbw, peak), JobContext(env=env))
    assert [t["variable"] for t in found] == ([named] if named else [])


def test_gradient_quantization_and_hpz_only_across_nodes() -> None:
    one_node = zero_pp_settings(_job_bw("intra-node", 20.0, 450.0), JobContext(gpus_per_node=8))
    assert one_node == {"zero_optimization.zero_quantized_weights": True}
    two_nodes = zero_pp_settings(_job_bw("inter-node", 7.0, None), JobContext(gpus_per_node=4))
    assert two_nodes["zero_optimization.zero_quantized_gradients"] is True
    assert two_nodes["zero_optimization.zero_hpz_partition_size"] == 4


def test_the_job_bandwidth_is_computed_once_for_the_rule_and_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bandwidth-bound rule judges the BANDWIDTH object the report shows: one computation (diagnose/facts/job.py)."""
    from overlapcheck.analysis import bandwidth
    from overlapcheck.diagnose.facts import job as job_facts

    calls: list[int] = []

    def counted(results: list, job: JobContext | None = None) -> JobBandwidth | None:
        calls.append(len(results))
        return bandwidth.job_bandwidth(results, job)

    monkeypatch.setattr(job_facts, "job_bandwidth", counted)
    report = analyze(SAMPLES / "degraded-network", jobs=1)
    assert calls == [len(report.ranks)] and report.bandwidth is not None
    assert _bandwidth_bound(report)  # the rule read it
