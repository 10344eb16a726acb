"""``nemo-muon preflight``: a recipe's exact optimizer path proven on this machine's GPUs before the long job.

Checks the request first (an unknown recipe, a recipe without a megatron backend or a layer-wise matrix optimizer,
an expert-parallel size the ranks cannot host: one line naming the field, nothing started), then runs
``python -m nemo_muon.preflight.main`` on ``--nproc-per-node`` ranks: under torchrun here (``--executor local``), or
as a Slurm job of ``--nodes`` nodes with one srun task per GPU (``--executor slurm``: the sbatch script `nemo-muon
launch` renders, with the preflight as its only step; written into ``--out``). Exit code: 0 when every check passed,
1 when one failed (its verdict is the last line), 2 for refused input; with Slurm and ``--wait``, the job's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
from nemo_muon.launchers.job import PREFLIGHT_MODULE, TORCHRUN_MODULE
from nemo_muon.launchers.launch import DRY_RUN_NAMES, await_job, merged_overrides, submit_script
from nemo_muon.launchers.launch_input import LaunchError, parse_env
from nemo_muon.launchers.slurm import SlurmJob, render_sbatch

from nemo_muon.preflight.request import DEFAULT_STEPS, DEFAULT_TIME_LIMIT_S, DEVICES, PreflightRequest
from nemo_muon.secret_policy import split_secrets

EXECUTORS = ("local", "slurm")
SLURM_TIME = "00:30:00"
"""Slurm time limit of a preflight job (chosen: twice the preflight's own default bound, 900 s)."""


def preflight_args(request: PreflightRequest) -> list[str]:
    """The arguments of the preflight entry point (after ``python``) for ``request``."""
    args = ["-m", PREFLIGHT_MODULE, "--recipe", request.recipe, "--out", request.out_dir, "--steps", str(request.steps),
            "--pp", str(request.pp), "--ep", str(request.ep), "--time-limit-s", f"{request.time_limit_s:g}"]
    if request.save_at is not None:
        args += ["--save-at", str(request.save_at)]
    if request.device != "cuda":
        args += ["--device", request.device]
    return [*args, *request.overrides]


def preflight_argv(request: PreflightRequest, nproc_per_node: int) -> list[str]:
    """The torchrun command line of ``request`` on this machine."""
    return [sys.executable, "-m", TORCHRUN_MODULE, "--standalone", "--nproc-per-node", str(nproc_per_node),
            *preflight_args(request)]


def preflight_job(request: PreflightRequest, *, nodes: int, nproc_per_node: int, account: str | None,
                  partition: str | None, time: str, image: str | None, container: bool,
                  env: dict[str, str]) -> SlurmJob:
    """The Slurm job of ``request``: ``nodes`` x ``nproc_per_node`` srun tasks of the entry point with the recipe's
    environment and ``env``, its log and script in ``request.out_dir`` (absolute). ValueError naming the option for
    bad input."""
    out = Path(request.out_dir)
    recipe = request.training_recipe()
    plain, secrets = split_secrets({**recipe.env, **env})  # the recipe's NCCL / CUDA variables, as its job has them
    gpu = "cpu" if request.device == "cpu" else recipe.system.gpu
    return SlurmJob(job_name=f"nemo-muon-preflight-{request.recipe}", nodes=nodes, gpus_per_node=nproc_per_node,
                    gpu=gpu, command=[], preflight=preflight_args(request),
                    python="python" if container else sys.executable,
                    launcher="tasks", output_dir=out, workdir=out, account=account, partition=partition, time=time,
                    container=container, image=image, mounts=[f"{out}:{out}"] if container else [], env=plain,
                    forwarded_env=list(secrets))


def _submit(job: SlurmJob, script: str, dry_run: bool, wait: bool, env: dict[str, str]) -> None:
    from nemo_muon.launchers import slurm

    from nemo_muon.config.files import make_folder

    path = job.output_dir / "preflight.sbatch"
    if dry_run:
        click.echo(f"# sbatch script ({path}):\n{script}# submit:\n{slurm.quote_argv(slurm.sbatch_argv(path))}")
        return
    make_folder(job.output_dir, what="the preflight folder")
    try:
        job_id = submit_script(path, script, {**os.environ, **env})
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"submitted slurm job {job_id}; log: {job.output_dir}/slurm-{job_id}.out; report: "
               f"{job.output_dir}/preflight.md")
    if not wait:
        return
    result = await_job(job_id, progress=False)
    click.echo(f"slurm job {job_id}: {result.state} (exit {result.exit_code})")
    sys.exit(1 if result.exit_code is None else result.exit_code)


@click.command("preflight")
@click.option("--recipe", required=True, help="The recipe whose optimizer path is proven (megatron backend).")
@click.option("--executor", type=click.Choice(EXECUTORS), default="local", show_default=True,
              help="Here under torchrun, or a Slurm job (one srun task per GPU).")
@click.option("--nproc-per-node", type=click.IntRange(min=1), default=1, show_default=True,
              help="Ranks per node (one per GPU).")
@click.option("--nodes", type=click.IntRange(min=1), default=1, show_default=True, help="Slurm: nodes.")
@click.option("--steps", type=int, default=DEFAULT_STEPS, show_default=True, help="Steps of each run.")
@click.option("--save-at", type=int, default=None, help="Save after this step and resume (default: steps // 2).")
@click.option("--pp", type=int, default=None,
              help="Pipeline-parallel size of the tiny model (divides the ranks and its 4 layers) [default: the "
                   "recipe's parallelism.pp scaled to the ranks, as launch --preflight runs it].")
@click.option("--ep", type=int, default=None,
              help="Expert-parallel size of the tiny model (divides a stage's ranks and its 8 experts) [default: the "
                   "recipe's parallelism.ep scaled to a stage's ranks, as launch --preflight runs it].")
@click.option("--out", "out_dir", default="preflight", show_default=True,
              help="Folder of preflight.json and preflight.md (Slurm: also the script and the job's log).")
@click.option("--time-limit-s", type=float, default=DEFAULT_TIME_LIMIT_S, show_default=True,
              help="Wall-clock bound of the whole preflight.")
@click.option("--device", type=click.Choice(DEVICES), default="cuda", show_default=True,
              help="cuda (NCCL); cpu (gloo) only where Megatron's CUDA calls are answered on CPU (the test harness).")
@click.option("--account", default=None, help="Slurm account.")
@click.option("--partition", default=None, help="Slurm partition.")
@click.option("--time", "time_", default=None, help=f"Slurm time limit [default: {SLURM_TIME}].")
@click.option("--image", default=None, help="Slurm: the container image (pyxis).")
@click.option("--container/--no-container", default=None,
              help="Slurm: run in the image with pyxis, or bare on the nodes [default: container].")
@click.option("--env", multiple=True, metavar="NAME[=VALUE]",
              help="Slurm: job variable (repeatable); a bare NAME forwards it from your environment.")
@click.option("--wait/--no-wait", default=None, help="Slurm: wait for the job; exit with its code [default: no-wait].")
@click.option(*DRY_RUN_NAMES, "dry_run", is_flag=True, help="Print the command (Slurm: the script) and exit.")
@merged_overrides
def preflight(recipe: str, executor: str, nproc_per_node: int, nodes: int, steps: int, save_at: int | None,
              pp: int | None, ep: int | None, out_dir: str, time_limit_s: float, device: str, account: str | None, partition: str | None,
              time_: str | None, image: str | None, container: bool | None, env: tuple[str, ...], wait: bool | None,
              dry_run: bool, overrides: tuple[str, ...]) -> None:
    """Prove RECIPE's optimizer path on this machine's GPUs; overrides are key=value (optimizer.collectives=...)."""
    from nemo_muon.train.refusals import REFUSED_EXIT

    if executor == "local":
        slurm_only = {"--nodes": nodes if nodes != 1 else None, "--account": account, "--partition": partition,
                      "--time": time_, "--image": image, "--container/--no-container": container,
                      "--env": env or None, "--wait/--no-wait": wait}
        given = [name for name, value in slurm_only.items() if value is not None]
        if given:
            raise click.UsageError(f"{', '.join(given)}: only with --executor slurm; got --executor local (this "
                                   "machine)")
    if executor == "slurm":
        out_dir = str(Path(out_dir).expanduser().absolute())
    try:
        request = PreflightRequest(recipe=recipe, world_size=nodes * nproc_per_node, overrides=overrides, steps=steps,
                                   save_at=save_at, pp=pp, ep=ep, out_dir=out_dir, time_limit_s=time_limit_s, device=device)
        job_env = parse_env(list(env), dict(os.environ))
        job = None if executor == "local" else preflight_job(
            request, nodes=nodes, nproc_per_node=nproc_per_node, account=account, partition=partition,
            time=time_ or SLURM_TIME, image=image, container=container is not False, env=job_env)
    except (ValueError, LaunchError) as exc:
        click.echo(f"preflight refused: {exc}", err=True)
        sys.exit(REFUSED_EXIT)
    if job is not None:
        _submit(job, render_sbatch(job, header=f"Generated by nemo-muon preflight --recipe {recipe} --executor slurm"),
                dry_run, bool(wait), job_env)
        return
    argv = preflight_argv(request, nproc_per_node)
    if dry_run:
        click.echo(" ".join(argv))
        return
    sys.exit(subprocess.run(argv, check=False).returncode)
