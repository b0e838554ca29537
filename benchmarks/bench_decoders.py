"""The trace decoder against what users have, in one run: `analyze` on one core and on every core, against HTA,
`orjson.loads`, a read-and-scan of the file, and the decoder candidates alone (the typed msgspec decoder the reader
uses, pyarrow's JSON reader when it is installed), with peak RSS; then a 32-rank set on 1 and 2 cores. Rows are
interleaved (each repeat runs every row once) so that the load of a shared machine falls on all of them alike; the
fastest of the repeats counts. CPU ratios are printed beside the wall ones: a loaded machine inflates wall times.

    .venv/bin/python -m benchmarks.bench_decoders                       # the real trace tiled to 415 MB, 32 ranks
    .venv/bin/python -m benchmarks.bench_decoders --size-mb 100 --repeat 3 --no-hta
    .venv/bin/python -m benchmarks.bench_decoders --also /path/to/other/checkout   # its analyze as one more row
    .venv/bin/python -m benchmarks.bench_decoders --pyarrow-python /other/venv/bin/python   # pyarrow lives there

The peak RSS of `analyze` is checked against the target (0.25x the file, `--rss-target`): a line that starts with
REGRESSION says when it is exceeded (the guard for the peak that once grew from 142 to 223 MB unmeasured).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile

from benchmarks import inputs as I
from benchmarks.measure import Run, measure

PY = sys.executable
MB = 1 << 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RANKS = os.path.join(I.DATA, "sim-32r-8s")  # overlapcheck simulate --nodes 4 --gpus-per-node 8 --steps 8
Rows = dict[str, tuple[list[str], dict[str, str] | None, float]]

_ORJSON = "import orjson, sys\nwith open(sys.argv[1], 'rb') as f: orjson.loads(f.read())"
# read the file in 16 MB pieces and count the event boundaries (`},`; one cut by a piece's end is missed): the
# floor for any reader that looks at every byte once
_SCAN = """import sys
n = 0
with open(sys.argv[1], 'rb') as f:
    while piece := f.read(16 << 20):
        n += piece.count(b"},")
print(n)"""
_HTA = """import sys
from hta.trace_analysis import TraceAnalysis
TraceAnalysis(trace_dir=sys.argv[1]).get_comm_comp_overlap(visualize=False)"""
# the reader's own chunking with its typed decoder, and nothing after it: what decoding alone costs
_MSGSPEC = """import sys
from overlapcheck.trace.events import EVENTS_DECODER
from overlapcheck.trace.jsonstream import TraceStream
print(sum(len(batch) for batch in TraceStream(sys.argv[1], EVENTS_DECODER).batches()))"""
# pyarrow's JSON reader over the event array (objects one after another: the commas between events become blanks,
# which Kineto's layout allows without a structure scan: `},` + newline never occurs inside a JSON string), with
# an explicit schema of the fields it can type. It cannot read pid / tid, which Kineto writes as numbers and as
# strings ("Spans"), so this row is a lower bound of what a pyarrow reader would cost.
_PYARROW = """import io, sys
import pyarrow as pa, pyarrow.json as pj
data = open(sys.argv[1], 'rb').read()
body = data[data.index(b'[', data.index(b'"traceEvents"')) + 1 : data.rindex(b']')].replace(b'},\\n', b'}\\n')
del data
args = pa.struct([("External id", pa.int64()), ("stream", pa.int64()), ("correlation", pa.int64()),
                  ("device", pa.int64())])
schema = pa.schema([("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()), ("ts", pa.float64()),
                    ("dur", pa.float64()), ("args", args)])
options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore", newlines_in_values=True)
table = pj.read_json(io.BytesIO(body), read_options=pj.ReadOptions(use_threads=False, block_size=4 << 20),
                     parse_options=options)
print(table.num_rows)"""


def _env(tree: str = ROOT) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": tree}


def _analyze(paths: list[str], out: str, jobs: int) -> list[str]:
    return [PY, "-m", "overlapcheck", "analyze", *paths, "--format", "json", "-o", out, "--force", "-j", str(jobs)]


def _hta_folder(path: str, tmp: str) -> str:
    folder = tempfile.mkdtemp(dir=tmp)
    os.symlink(os.path.abspath(path), os.path.join(folder, "rank-0.json"))
    return folder


def _line(r: Run, size: int) -> str:
    state = "" if r.ok else f"  ({r.error})" if r.timed_out else f"  FAILED: {r.error}"
    return (
        f"    {r.name:<40} {r.wall_s:8.2f} s wall {r.cpu_s:8.2f} s cpu {r.peak_rss_mb:7.0f} MB peak "
        f"({r.peak_rss_mb * MB / size:.2f}x file){state}"
    )


def run_rows(rows: Rows, repeat: int) -> dict[str, Run]:
    """Every row once per repeat, interleaved; the fastest good run of each."""
    runs: dict[str, list[Run]] = {name: [] for name in rows}
    for _ in range(repeat):
        for name, (argv, env, timeout) in rows.items():
            runs[name].append(measure(name, argv, timeout=timeout, env=env))
    out = {}
    for name, rs in runs.items():
        good = [r for r in rs if r.ok]
        out[name] = min(good, key=lambda r: r.wall_s) if good else rs[-1]
    return out


def _ratio(a: Run | None, b: Run | None, cpu: bool = False) -> str:
    """b / a (how many times faster a is), `>=` when b hit its time limit."""
    if a is None or b is None or not a.ok or not (b.ok or b.timed_out):
        return "-"
    x = (b.cpu_s / a.cpu_s) if cpu and b.ok else (b.wall_s / a.wall_s)
    return f">= {x:.2f}" if b.timed_out else f"{x:.2f}"


def _verdicts(name: str, a: Run, res: dict[str, Run], size: int, rss_target: float) -> None:
    scan = res["read-and-scan"]
    print(f"  {name}:")
    for label, other, target in (("HTA", res.get("HTA"), ">= 25"), ("orjson.loads", res["orjson.loads"], ">= 4")):
        print(f"    x faster than {label:<13} (target {target})   wall {_ratio(a, other):>6}  "
              f"cpu {_ratio(a, other, cpu=True):>6}")  # fmt: skip
    if a.ok and scan.ok:
        print(f"    x the read-and-scan's time (target <= 3)  wall {a.wall_s / scan.wall_s:6.2f}  "
              f"cpu {a.cpu_s / scan.cpu_s:6.2f}")  # fmt: skip
    if not a.ok:
        return
    share = a.peak_rss_mb * MB / size
    limit = rss_target * size / MB
    if share > rss_target:
        print(f"REGRESSION: {name}: peak RSS {a.peak_rss_mb:.0f} MB = {share:.2f}x the file, over the target "
              f"{rss_target:.2f}x ({limit:.0f} MB)")  # fmt: skip
    else:
        print(f"    peak RSS within the target ({a.peak_rss_mb:.0f} MB <= {limit:.0f} MB)")


def big_trace(path: str, repeat: int, hta: bool, hta_timeout: float, rss_target: float, also: str | None,
              pyarrow_python: str | None, tmp: str) -> None:  # fmt: skip
    size = os.path.getsize(path)
    out = os.path.join(tmp, "report.json")
    cores = os.cpu_count() or 1
    rows: Rows = {
        "analyze -j1": (_analyze([path], out, 1), _env(), 3600),
        f"analyze -j{cores}": (_analyze([path], out, cores), _env(), 3600),
    }
    if also:
        rows[f"analyze -j1 ({os.path.basename(os.path.abspath(also))})"] = (_analyze([path], out, 1), _env(also), 3600)
    rows["decode only: msgspec (the reader's)"] = ([PY, "-c", _MSGSPEC, path], _env(), 3600)
    if pyarrow_python:
        rows["decode only: pyarrow.json, 1 thread"] = ([pyarrow_python, "-c", _PYARROW, path], None, 3600)
    rows["orjson.loads"] = ([PY, "-c", _ORJSON, path], None, 3600)
    rows["read-and-scan"] = ([PY, "-c", _SCAN, path], None, 3600)
    if hta:
        rows["HTA"] = ([PY, "-c", _HTA, _hta_folder(path, tmp)], None, hta_timeout)
    print(f"\n{path} ({size / MB:.0f} MB), {repeat} interleaved repeat(s):", flush=True)
    res = run_rows(rows, repeat)
    for r in res.values():
        print(_line(r, size))
    for name in rows:
        if name.startswith("analyze"):
            _verdicts(name, res[name], res, size, rss_target)


def ranks(folder: str, repeat: int, tmp: str) -> None:
    traces = sorted(os.path.join(folder, n) for n in os.listdir(folder) if ".trace.json" in n)
    size = sum(os.path.getsize(p) for p in traces)
    out = os.path.join(tmp, "report.json")
    rows: Rows = {f"{len(traces)} ranks -j{jobs}": (_analyze([folder], out, jobs), _env(), 3600) for jobs in (1, 2)}
    print(f"\n{folder}: {len(traces)} ranks, {size / MB:.0f} MB on disk, {repeat} interleaved repeat(s):", flush=True)
    res = run_rows(rows, repeat)
    for r in res.values():
        print(_line(r, size))
    one, two = (res[f"{len(traces)} ranks -j{j}"] for j in (1, 2))
    print(f"  speed-up with 2 cores: {_ratio(two, one)}x wall")


def _ranks_folder() -> str:
    if not os.path.isfile(os.path.join(RANKS, "truth.json")):
        import subprocess

        argv = [PY, "-m", "overlapcheck", "simulate", "--out", RANKS, "--nodes", "4", "--gpus-per-node", "8"]
        subprocess.run([*argv, "--steps", "8", "--force"], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)
    return RANKS


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=415, help="the real trace tiled to this size (default 415)")
    parser.add_argument("--trace", help="a trace file to use instead of the tiled real trace")
    parser.add_argument("--repeat", type=int, default=1, help="interleaved repeats; the fastest counts")
    parser.add_argument("--no-hta", action="store_true", help="leave HTA out (it takes about 10x analyze)")
    parser.add_argument("--hta-timeout", type=float, default=600)
    parser.add_argument("--rss-target", type=float, default=0.25, help="peak RSS / file size (default 0.25)")
    parser.add_argument("--also", help="another checkout of overlapcheck: its `analyze -j1` as one more row")
    parser.add_argument(
        "--pyarrow-python",
        default=PY if importlib.util.find_spec("pyarrow") else None,
        help="a Python with pyarrow for the pyarrow row (default: this one when it has pyarrow, else no row)",
    )
    parser.add_argument("--no-ranks", action="store_true", help="leave the 32-rank set out")
    parser.add_argument("--no-big", action="store_true", help="leave the big trace out (only the 32-rank set)")
    args = parser.parse_args(argv)
    os.makedirs(I.DATA, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        if not args.no_big:
            path = args.trace or I.tiled(I.REAL, "real", args.size_mb).path
            big_trace(
                path,
                args.repeat,
                not args.no_hta,
                args.hta_timeout,
                args.rss_target,
                args.also,
                args.pyarrow_python,
                tmp,
            )
        if not args.no_ranks:
            ranks(_ranks_folder(), args.repeat, tmp)


if __name__ == "__main__":
    main()
