"""The CI regression gate: checks a Report against thresholds and a baseline Report.

How checks treat ranks (documented in docs/ci-gate.md):
- every check reduces the per-rank values to one number, either the *worst* rank (the lowest overlap, the
  highest exposed share or exposed time) or the *median* rank. By default thresholds use the worst rank
  (a threshold is a promise about every rank) and baseline comparisons the median rank (the worst rank is
  noisier run to run); `across` picks one reduction for every check;
- `min-overlap.<kind>`: `collectives.<kind>.overlap` of the rank (whole trace) >= the threshold;
- `max-exposed-share`: the rank's `exposed_share` <= the threshold;
- `exposed-regression.<kind>`: exposed communication of that kind *per profiled step* (the mean over the
  rank's steps, or the whole trace when it has none) may grow over the baseline by at most
  `max(relative * baseline, ignore_below_us)`, so sub-noise changes never fail a build;
- `overlap-drop.<kind>`: the overlap may fall below the baseline's by at most the given fraction
  (0.05 = 5 percentage points), unless the kind's exposed time per step grew by no more than
  `ignore_below_us` (a tiny collective's overlap swings with noise);
- with a baseline and no explicit baseline check, both checks run for `all` and for every collective kind
  present in the baseline (DEFAULT_REGRESSION, DEFAULT_DROP tolerances).

The baseline checks read what changed from `compare.compare(baseline, report)`: the one implementation
of "what changed" that `overlapcheck compare` prints (ranks present in both reports, values per step).
"""

from __future__ import annotations

import json
import math
import os
import stat
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from overlapcheck.compare import Comparison, Side, compare
from overlapcheck.errors import UserError
from overlapcheck.fsutil import read_bytes
from overlapcheck.model import ALL, COLLECTIVE_KEYS, RankMetrics, Report
from overlapcheck.report.present import duration as fmt_us
from overlapcheck.report.present import pct as fmt_pct

if TYPE_CHECKING:
    from rich.table import Table

ACROSS = ("worst", "median")
DEFAULT_REGRESSION = 0.10  # with --baseline and no explicit baseline check: for all and every baseline kind
DEFAULT_DROP = 0.05


@dataclass(frozen=True)
class Check:
    """The outcome of one gate check; `id` is stable (JUnit test case name), `name` is for people."""

    id: str
    name: str
    passed: bool
    measured: str
    limit: str
    detail: str = ""


@dataclass
class GateConfig:
    """What the gate checks. Fractions are in [0, 1]; regressions are relative (0.1 = +10 %)."""

    min_overlap: dict[str, float] = field(default_factory=dict)
    max_exposed_share: float | None = None
    max_exposed_regression: dict[str, float] = field(default_factory=dict)
    max_overlap_drop: dict[str, float] = field(default_factory=dict)
    ignore_below_us: float = 100.0
    across: str | None = None  # None: worst rank for thresholds, median rank for baseline comparisons

    def reduction(self, baseline_check: bool) -> str:
        return self.across or ("median" if baseline_check else "worst")


# ----------------------------------------------------------------------------------------------- input


# far above a report of thousands of ranks (~30 KB each); parsing one this size takes about 4x in memory
MAX_REPORT_BYTES = 256 << 20


def load_report(path: str) -> Report:
    """Read and validate a report document; any problem is a UserError (exit code 2)."""
    return read_report(path)[0]


def read_report(path: str) -> tuple[Report, bytes]:
    """The validated Report of a JSON file, and the file's bytes."""
    raw = read_bytes(path, "an overlapcheck report", MAX_REPORT_BYTES)
    first = "run `overlapcheck analyze TRACES --format json -o report.json` first and give that report"
    if raw[:2] == b"\x1f\x8b":
        raise UserError(f"a gzip file (a trace?), not an overlapcheck report: {first}", path)
    try:
        doc = json.loads(raw)
    except RecursionError:
        raise UserError("not an overlapcheck report: JSON nested too deeply", path) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"not JSON ({exc})".splitlines()[0], path) from None
    if isinstance(doc, list) or (isinstance(doc, dict) and "schema" not in doc and "traceEvents" in doc):
        raise UserError(f"a trace, not an overlapcheck report: {first}", path)
    return Report.from_dict(doc, path), raw


def _ascii_float(text: str) -> float:
    """float(text) of a number written in ASCII, without digit separators: float() also takes '٠٫٥' and '1_0',
    which no threshold means."""
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return float(text)


def parse_fraction(text: str, what: str, allow_over_one: bool = False) -> float:
    """'0.8' or '80%' -> 0.8. A bare number must lie in [0, 1]; a percentage may exceed 100 % if allowed."""
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = _ascii_float(raw[:-1] if percent else raw)
    except ValueError:
        raise UserError(f"{what}: {text!r} is not a number (write 0.8 or 80%)") from None
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{what}: {text!r} must be a finite, non-negative number")
    if percent:
        value /= 100.0
    elif value > 1:
        raise UserError(f"{what}: {text!r} is above 1; write a fraction (0.1) or a percentage (10%)")
    if value > 1 and not allow_over_one:
        raise UserError(f"{what}: {text!r} is above 100%")
    return value


def _kind(name: str, what: str) -> str:
    kind = name.strip().replace("-", "_")
    if kind not in COLLECTIVE_KEYS:
        raise UserError(f"{what}: unknown collective {name!r} (one of {', '.join(COLLECTIVE_KEYS)})")
    return kind


def parse_min_overlap(items: Iterable[str]) -> dict[str, float]:
    """['reduce_scatter=0.8', 'all=70%'] -> {'reduce_scatter': 0.8, 'all': 0.7}."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--min-overlap: {item!r} is not KIND=FRACTION (e.g. reduce_scatter=0.8)")
        kind = _kind(name, "--min-overlap")
        _once(out, kind, parse_fraction(value, f"--min-overlap {name.strip()}"), "--min-overlap")
    return out


def _once(out: dict[str, float], kind: str, value: float, what: str) -> None:
    """out[kind] = value; a KIND given twice with two values is a UserError (the later one silently replaced a
    stricter one: `--min-overlap all=0.9 --min-overlap all=0.5` gated at 50%)."""
    if kind in out and out[kind] != value:
        raise UserError(f"{what}: {kind} is given twice ({out[kind]:g} and {value:g}); give each kind once")
    out[kind] = value


def parse_regressions(
    items: Iterable[str], what: str = "--max-exposed-regression", allow_over_one: bool = True
) -> dict[str, float]:
    """['10%'] -> {'all': 0.1}; ['all_gather=25%'] -> {'all_gather': 0.25}."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, value = item.rpartition("=")
        kind = _kind(name, what) if sep else "all"
        _once(out, kind, parse_fraction(value, what, allow_over_one=allow_over_one), what)
    return out


def parse_us(text: str, what: str) -> float:
    """A non-negative number of microseconds."""
    try:
        value = _ascii_float(text)
    except ValueError:
        raise UserError(f"{what}: {text!r} is not a number of microseconds") from None
    if not math.isfinite(value) or value < 0:
        raise UserError(f"{what}: {text!r} must be a finite, non-negative number of microseconds")
    return value


# ------------------------------------------------------------------------------------------- per rank


@dataclass(frozen=True)
class Reduced:
    """A per-rank metric reduced across ranks: the value, which rank it is ('median' has none), and N."""

    value: float | None
    rank: int | None
    ranks: int

    def where(self, across: str) -> str:
        if self.value is None:
            return "no rank defines it"
        if across == "median":
            return f"median of {self.ranks} rank{'s' if self.ranks != 1 else ''}"
        return f"worst rank {self.rank} of {self.ranks}"


def reduce_ranks(
    report: Report, metric: Callable[[RankMetrics], float | None], across: str, higher_is_worse: bool
) -> Reduced:
    """Reduce `metric` over the report's ranks (ignoring ranks where it is None)."""
    pairs = [(r.rank, v) for r in report.ranks if r.rank is not None and (v := metric(r)) is not None]
    return reduce_pairs(pairs, across, higher_is_worse)


def reduce_pairs(pairs: Sequence[tuple[int, float]], across: str, higher_is_worse: bool) -> Reduced:
    """(rank, value) pairs reduced to their median, or to their worst value and its rank."""
    if not pairs:
        return Reduced(None, None, 0)
    if across == "median":
        return Reduced(statistics.median(v for _, v in pairs), None, len(pairs))
    pick = max if higher_is_worse else min
    rank, value = pick(pairs, key=lambda p: p[1])
    return Reduced(value, rank, len(pairs))


# ---------------------------------------------------------------------------------------------- checks


def run_checks(report: Report, config: GateConfig, baseline: Report | None = None) -> list[Check]:
    """Every check the configuration asks for, in a stable order (inputs, thresholds, regressions)."""
    if config.across is not None and config.across not in ACROSS:
        raise UserError(f"--across must be one of {', '.join(ACROSS)}")
    if (config.max_exposed_regression or config.max_overlap_drop) and baseline is None:
        raise UserError("--max-exposed-regression and --max-overlap-drop need --baseline BASE.json")
    checks = [_inputs_check(report)]
    for kind, threshold in config.min_overlap.items():
        checks.append(_min_overlap_check(report, kind, threshold, config.reduction(False)))
    if config.max_exposed_share is not None:
        checks.append(_exposed_share_check(report, config.max_exposed_share, config.reduction(False)))
    if baseline is not None:
        comparison = compare(baseline, report)
        checks.append(_same_job_check(comparison))
        regressions, drops = config.max_exposed_regression, config.max_overlap_drop
        if not (regressions or drops):
            kinds = default_kinds(baseline)
            regressions = dict.fromkeys(kinds, DEFAULT_REGRESSION)
            drops = dict.fromkeys(kinds, DEFAULT_DROP)
        for kind, rel in regressions.items():
            checks.append(_regression_check(comparison, kind, rel, config))
        for kind, points in drops.items():
            checks.append(_overlap_drop_check(comparison, kind, points, config))
    return checks


def default_kinds(baseline: Report) -> list[str]:
    """`all` and every collective kind that some rank of the baseline has, in report order."""
    from overlapcheck.report.present import present_kinds

    return [ALL, *present_kinds(baseline.ranks)]


def exit_code(checks: list[Check]) -> int:
    """0 when every check passed, 1 otherwise."""
    return 0 if all(c.passed for c in checks) else 1


def _inputs_check(report: Report) -> Check:
    errors = report.errors
    n = len(report.ranks)
    if not n:
        return Check(
            "inputs",
            "inputs read",
            False,
            "0 ranks",
            "≥ 1 rank, all readable",
            "the report has no ranks: nothing was measured",
        )
    if errors:
        sources = ", ".join(e.source for e in errors[:3])
        more = f" and {len(errors) - 3} more" if len(errors) > 3 else ""
        return Check(
            "inputs",
            "inputs read",
            False,
            f"{n} ranks, {len(errors)} unreadable",
            "≥ 1 rank, all readable",
            f"could not read {sources}{more}",
        )
    return Check("inputs", "inputs read", True, f"{n} rank{'s' if n != 1 else ''}", "≥ 1 rank, all readable")


def _same_job_check(comparison: Comparison) -> Check:
    """The baseline is like for like: as many ranks as the report, and numbers on the same basis (per profiled
    step on both sides, or whole-trace totals on both). A baseline of another world size moves every per-step
    number for that alone; one without ProfilerSteps holds totals over its whole trace, which the report's
    per-step numbers would undercut N-fold. Either way its comparisons pass or fail on nothing the change did."""
    base, cur = comparison.before, comparison.after

    def shape(side: Side) -> str:
        ranks = f"{side.world_size} ranks" if side.world_size is not None else "world size unknown"
        return f"{ranks}, {'per step' if side.steps else 'whole trace'}"

    why = []
    if base.world_size is not None and cur.world_size is not None and base.world_size != cur.world_size:
        why.append("the baseline ran on another number of ranks (another job, or another scale)")
    shared = comparison.shared
    if not shared.ranks and (shared.only_before or shared.only_after):
        why.append(
            "no rank is in both (the baseline's and this report's ranks differ): nothing to compare rank by rank"
        )
    if bool(base.steps) != bool(cur.steps):
        whole = "the baseline" if not base.steps else "this report"
        why.append(f"{whole} has no ProfilerStep, so its numbers are whole-trace totals, the other's per step")
    detail = "; ".join(why) + ": save a baseline of this job (`overlapcheck baseline save`)" if why else ""
    return Check("baseline-comparable", "baseline is like for like", not why, shape(cur), shape(base), detail)


def _min_overlap_check(report: Report, kind: str, threshold: float, across: str) -> Check:
    red = reduce_ranks(report, lambda r: r.overlap(kind), across, higher_is_worse=False)
    name = f"{kind} overlap ({across})"
    limit = f"≥ {fmt_pct(threshold)}"
    if red.value is None:
        return Check(
            f"min-overlap.{kind}",
            name,
            False,
            "n/a",
            limit,
            f"no rank has {kind} communication, so its overlap is not measured",
        )
    return Check(f"min-overlap.{kind}", name, red.value >= threshold, fmt_pct(red.value), limit, red.where(across))


def _exposed_share_check(report: Report, threshold: float, across: str) -> Check:
    red = reduce_ranks(report, lambda r: r.exposed_share, across, higher_is_worse=True)
    name = f"exposed share of step time ({across})"
    limit = f"≤ {fmt_pct(threshold)}"
    if red.value is None:
        return Check("max-exposed-share", name, True, "n/a", limit, "no rank has communication: nothing is exposed")
    return Check("max-exposed-share", name, red.value <= threshold, fmt_pct(red.value), limit, red.where(across))


def reduce_side(
    comparison: Comparison, side: str, kind: str, metric: str, across: str, higher_is_worse: bool
) -> Reduced:
    """One side of a comparison reduced across its compared ranks (`Comparison.values`)."""
    return reduce_pairs(comparison.values(side, kind, metric), across, higher_is_worse)


def _shared_detail(comparison: Comparison) -> str:
    shared = comparison.shared
    if not (shared.only_before or shared.only_after):
        return ""
    n_base = len(shared.ranks) + len(shared.only_before)
    n_cur = len(shared.ranks) + len(shared.only_after)
    if not shared.ranks:
        return f"; rank count differs ({n_cur} vs {n_base}), no rank in common"
    return f"; rank count differs ({n_cur} vs {n_base}): compared on the {len(shared.ranks)} ranks in both"


def _regression_check(comparison: Comparison, kind: str, rel: float, config: GateConfig) -> Check:
    across = config.reduction(True)
    cur = reduce_side(comparison, "after", kind, "exposed_us", across, higher_is_worse=True)
    base = reduce_side(comparison, "before", kind, "exposed_us", across, higher_is_worse=True)
    name = f"{kind} exposed per step vs baseline ({across})"
    limit = f"≤ +{rel * 100:.0f}% (or +{fmt_us(config.ignore_below_us)})"
    cur_v, base_v = cur.value or 0.0, base.value or 0.0
    delta = cur_v - base_v
    allowed = max(rel * base_v, config.ignore_below_us)
    change = f"{delta / base_v * 100:+.1f}%" if base_v > 0 else f"{'+' if delta >= 0 else '-'}{fmt_us(abs(delta))}"
    measured = f"{fmt_us(cur_v)} vs {fmt_us(base_v)} ({change})"
    detail = f"{cur.where(across)}; baseline {base.where(across)}"
    if delta > 0 and delta <= allowed and delta > rel * base_v:
        detail += f"; +{fmt_us(delta)} is under the {fmt_us(config.ignore_below_us)} noise floor"
    detail += _shared_detail(comparison)
    return Check(f"exposed-regression.{kind}", name, delta <= allowed, measured, limit, detail)


def _overlap_drop_check(comparison: Comparison, kind: str, points: float, config: GateConfig) -> Check:
    across = config.reduction(True)
    cur = reduce_side(comparison, "after", kind, "overlap", across, higher_is_worse=False)
    base = reduce_side(comparison, "before", kind, "overlap", across, higher_is_worse=False)
    name = f"{kind} overlap vs baseline ({across})"
    limit = f"drop ≤ {points * 100:.1f} pts"
    if cur.value is None or base.value is None:
        # communication the baseline measured and this report lacks is a capture that lost it (NCCL not
        # profiled, a CPU-only trace, other steps), never a pass
        vanished = base.value is not None
        detail = (
            f"the baseline has {kind} communication and this report has none: was it captured (the same job, "
            "steps and ranks, with CUDA activities on)?"
            if vanished
            else f"no {kind} communication in the baseline: nothing to compare"
        )
        return Check(
            f"overlap-drop.{kind}",
            name,
            not vanished,
            f"{fmt_pct(cur.value)} vs {fmt_pct(base.value)}",
            limit,
            detail,
        )
    drop = base.value - cur.value
    measured = f"{fmt_pct(cur.value)} vs {fmt_pct(base.value)} ({-drop * 100:+.1f} pts)"
    detail = f"{cur.where(across)}; baseline {base.where(across)}"
    passed = drop <= points + 1e-12
    if not passed:
        exposed_cur = reduce_side(comparison, "after", kind, "exposed_us", across, higher_is_worse=True).value
        exposed_base = reduce_side(comparison, "before", kind, "exposed_us", across, higher_is_worse=True).value
        grew = (exposed_cur or 0.0) - (exposed_base or 0.0)
        if grew <= config.ignore_below_us:
            passed = True
            detail += (
                f"; its exposed time grew by {fmt_us(max(grew, 0.0))} per step, under the "
                f"{fmt_us(config.ignore_below_us)} noise floor"
            )
    detail += _shared_detail(comparison)
    return Check(f"overlap-drop.{kind}", name, passed, measured, limit, detail)


# ---------------------------------------------------------------------------------------------- output


def render_table(checks: list[Check]) -> Table:
    """A rich Table of the checks (rich is imported here, not at module import)."""
    from rich.table import Table
    from rich.text import Text

    from overlapcheck.report.present import safe_line

    table = Table(title="overlapcheck gate", title_justify="left", header_style="bold")
    for col in ("result", "check", "measured", "limit", "detail"):
        table.add_column(col, overflow="fold")
    for c in checks:
        result = Text("PASS", style="bold green") if c.passed else Text("FAIL", style="bold red")
        table.add_row(result, Text(c.name), Text(c.measured), Text(c.limit), Text(safe_line(c.detail), style="dim"))
    return table


def verdict_line(checks: list[Check]) -> str:
    failed = sum(not c.passed for c in checks)
    if not failed:
        return f"gate: PASS ({len(checks)} check{'s' if len(checks) != 1 else ''})"
    return f"gate: FAIL ({failed} of {len(checks)} checks failed)"


def append_step_summary(markdown: str, env: dict[str, str] | None = None) -> str | None:
    """Append to $GITHUB_STEP_SUMMARY when it is set; returns the path written, if any."""
    path = (env if env is not None else os.environ).get("GITHUB_STEP_SUMMARY")
    if not path:
        return None
    if os.path.realpath(path) == os.devnull:
        return path
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644)  # non-blocking: a FIFO there never blocks the gate (refused below)
    except OSError as exc:
        raise UserError(f"cannot append to $GITHUB_STEP_SUMMARY: {exc.strerror}", path) from None
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError("cannot append to $GITHUB_STEP_SUMMARY: not a regular file", path)
        try:
            fh.write(markdown if markdown.endswith("\n") else markdown + "\n")
            fh.flush()
        except OSError as exc:
            raise UserError(f"cannot append to $GITHUB_STEP_SUMMARY: {exc.strerror}", path) from None
    return path
