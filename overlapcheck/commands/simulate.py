"""`overlapcheck simulate`: write a simulated ZeRO-3 trace set with its ground truth."""

from __future__ import annotations

from pathlib import Path

import click

from overlapcheck.commands.once import OnceCommand
from overlapcheck.commands.paths import a_file_path
from overlapcheck.errors import UserError
from overlapcheck.report.present import safe_path


@click.command("simulate", cls=OnceCommand)
@click.option(
    "--scenario", default="healthy", show_default=True, help="Preset name; 'a+b' applies a then b. See --list."
)
@click.option("--out", "out", type=click.Path(file_okay=False), callback=a_file_path, help="Output directory.")
@click.option("--list", "list_presets", is_flag=True, help="List the presets and exit.")
@click.option("--nodes", type=click.IntRange(1, 1024), help="Nodes (default: the preset's; at most 1024).")
@click.option("--gpus-per-node", type=click.IntRange(1, 64), help="GPUs per node (default: the preset's; at most 64).")
@click.option("--gpu", type=click.Choice(["A100", "H100"]), help="GPU model.")
@click.option("--seed", type=int, help="Seed for jitter, straggler choice and clock offsets.")
@click.option("--steps", type=int, help="Profiled steps (after one warm-up step); ranks x steps at most 8192 (memory).")
@click.option("--torch-version", help="torch version (stream of sync collectives, trace schema).")
@click.option("--nccl-version", help="NCCL version (kernel names); default follows --torch-version.")
@click.option("--deepspeed-version", help="DeepSpeed version (call stacks, fixed behaviours).")
@click.option(
    "--layout",
    type=click.Choice(["default", "ds013"]),
    help="How the traces are written: ds013 = DeepSpeed 0.13.3 + torch 1.13.1 + NCCL 2.14 (DS #5201's stack).",
)
@click.option(
    "--module-frames",
    is_flag=True,
    default=None,
    help="Write nn.Module frames and overlapcheck run's module annotations, with the per-module truth.",
)
@click.option("--force", is_flag=True, help="Overwrite a non-empty output directory.")
def command(scenario: str, out: str | None, list_presets: bool, force: bool, **options) -> None:
    """Simulate a DeepSpeed ZeRO-3 job: one Kineto trace per rank, truth.json and ds_config.json.

    \b
    Examples:
      overlapcheck simulate --list
      overlapcheck simulate --scenario seed-5201 --out sim/ && overlapcheck analyze sim/
    """
    from overlapcheck.simulate import generate
    from overlapcheck.simulate.scenarios import PRESETS

    if list_presets:
        width = max(len(name) for name in PRESETS)
        for name, preset in PRESETS.items():
            click.echo(f"{name:<{width}}  {preset.summary}")
        return
    if out is None:
        raise UserError("--out DIR is required (or --list)")
    import sys

    def progress(line: str) -> None:  # on a terminal only: logs and pipes get the result lines alone
        if sys.stderr.isatty():
            click.echo(f"\r\033[K{line}", err=True, nl=False)

    truth = generate(scenario, Path(out), force=force, progress=progress, **options)
    if sys.stderr.isatty():
        click.echo("\r\033[K", err=True, nl=False)
    # cost: the step time of this job minus that of the same job without the effect (a counterfactual run)
    causes = ", ".join(f"{c['rule']} ({c['cost_us'] / 1000:.2f} ms/step)" for c in truth["causes"]) or "none"
    click.echo(f"wrote {len(truth['ranks'])} rank traces, truth.json and ds_config.json to {safe_path(out)}")
    click.echo(f"step time {truth['step_time_us'] / 1000:.2f} ms; planted causes: {causes}")
