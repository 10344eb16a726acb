"""``nemo-muon preflight``: a recipe's exact optimizer path proven on this machine's GPUs before the long job.

Checks the request first (an unknown recipe, a recipe without a megatron backend or a layer-wise matrix optimizer,
an expert-parallel size the ranks cannot host: one line naming the field, nothing started), then runs
``python -m nemo_muon.preflight.main`` on ``--nproc-per-node`` ranks under torchrun (`nemo_muon.preflight`).
Exit code: 0 when every check passed, 1 when one failed (its verdict is the last line), 2 for refused input.
"""

from __future__ import annotations

import subprocess
import sys

import click
from nemo_muon.launchers.job import TORCHRUN_MODULE
from nemo_muon.launchers.launch import DRY_RUN_NAMES, merged_overrides

from nemo_muon.preflight.request import DEFAULT_STEPS, DEFAULT_TIME_LIMIT_S, PreflightRequest


def preflight_argv(request: PreflightRequest, nproc_per_node: int) -> list[str]:
    """The torchrun command line of ``request`` on this machine."""
    argv = [sys.executable, "-m", TORCHRUN_MODULE, "--standalone", "--nproc-per-node", str(nproc_per_node),
            "-m", "nemo_muon.preflight.main", "--recipe", request.recipe, "--out", request.out_dir,
            "--steps", str(request.steps), "--ep", str(request.ep), "--time-limit-s", f"{request.time_limit_s:g}"]
    if request.save_at is not None:
        argv += ["--save-at", str(request.save_at)]
    return [*argv, *request.overrides]


@click.command("preflight")
@click.option("--recipe", required=True, help="The recipe whose optimizer path is proven (megatron backend).")
@click.option("--nproc-per-node", type=click.IntRange(min=1), default=1, show_default=True,
              help="Ranks on this machine (one per GPU).")
@click.option("--steps", type=int, default=DEFAULT_STEPS, show_default=True, help="Steps of each run.")
@click.option("--save-at", type=int, default=None, help="Save after this step and resume (default: steps // 2).")
@click.option("--ep", type=int, default=1, show_default=True, help="Expert-parallel size of the tiny model.")
@click.option("--out", "out_dir", default="preflight", show_default=True,
              help="Folder of preflight.json and preflight.md.")
@click.option("--time-limit-s", type=float, default=DEFAULT_TIME_LIMIT_S, show_default=True,
              help="Wall-clock bound of the whole preflight.")
@click.option(*DRY_RUN_NAMES, "dry_run", is_flag=True, help="Print the command and exit.")
@merged_overrides
def preflight(recipe: str, nproc_per_node: int, steps: int, save_at: int | None, ep: int, out_dir: str,
              time_limit_s: float, dry_run: bool, overrides: tuple[str, ...]) -> None:
    """Prove RECIPE's optimizer path on this machine's GPUs; overrides are key=value (optimizer.collectives=...)."""
    from nemo_muon.train.refusals import REFUSED_EXIT

    try:
        request = PreflightRequest(recipe=recipe, world_size=nproc_per_node, overrides=overrides, steps=steps,
                                   save_at=save_at, ep=ep, out_dir=out_dir, time_limit_s=time_limit_s)
    except ValueError as exc:
        click.echo(f"preflight refused: {exc}", err=True)
        sys.exit(REFUSED_EXIT)
    argv = preflight_argv(request, nproc_per_node)
    if dry_run:
        click.echo(" ".join(argv))
        return
    sys.exit(subprocess.run(argv, check=False).returncode)
