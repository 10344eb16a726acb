"""``nemo-muon launch``: run a recipe here (torchrun), in docker, or on Slurm; ``--dry-run`` prints exactly that."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from nemo_muon.launchers.cli_types import FINITE_POSITIVE
from nemo_muon.launchers.job import LaunchError, LaunchOptions, LaunchPlan, build_plan

from nemo_muon.config.files import make_folder, write_file
from nemo_muon.secret_policy import mask_text, secret_values


@dataclass(kw_only=True)
class LaunchResult:
    """What happened: the Slurm job id (if any), its final state when waited for, the exit code."""

    job_id: str | None = None
    state: str | None = None
    exit_code: int | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 if self.state is None else self.state == "COMPLETED"


def _progress(job_id: str) -> Any:
    def show(state: str, elapsed: float) -> None:
        click.echo(f"\rslurm job {job_id}: {state:<10} {elapsed:6.1f} s", nl=False, err=True)
    return show


def execute(plan: LaunchPlan, *, wait: bool = True, timeout_s: float | None = None,
            progress: bool = True) -> LaunchResult:
    """Run or submit the plan. Local/docker runs block (the preflight first, where the plan has one: the run starts
    only when it exited 0); Slurm waits (polling squeue at 0.5 s) only if ``wait``.

    Ctrl-C while waiting on a Slurm job cancels it (scancel) before returning. Without ``progress`` (``--json``),
    a local/docker run's output goes to stderr so stdout stays machine-readable.
    """
    if plan.script is None:
        if plan.executor == "docker" and plan.recipe.system.num_nodes > 1:
            missing = [v for v in ("PET_NODE_RANK", "PET_MASTER_ADDR") if v not in plan.process_env()]
            if missing:
                raise LaunchError(f"a {plan.recipe.system.num_nodes}-node docker run needs {missing} set on each "
                                  "node (PET_NODE_RANK=0..N-1, PET_MASTER_ADDR=<node 0>); got them unset")
        make_folder(plan.run_dir, what="the run folder")
        plan.write_recipe_file()  # what every rank loads (--recipe-file)
        stdout = None if progress else 2
        if plan.preflight_argv is not None:
            code = subprocess.run(plan.preflight_argv, env=plan.process_env(), stdout=stdout, check=False).returncode
            if code != 0:
                click.echo(f"preflight failed (exit {code}): the run was not started; report: "
                           f"{plan.preflight_dir}/preflight.md", err=True)
                return LaunchResult(exit_code=code)
        code = subprocess.run(plan.argv, env=plan.process_env(), stdout=stdout, check=False).returncode
        return LaunchResult(exit_code=code)
    assert plan.script_path is not None
    make_folder(plan.run_dir, what="the run folder")
    plan.write_recipe_file()  # before the script that names it is submitted
    job_id = submit_script(plan.script_path, plan.script, plan.process_env())
    if not wait:
        return LaunchResult(job_id=job_id)
    return await_job(job_id, timeout_s=timeout_s, progress=progress)


def submit_script(path: Path, script: str, env: dict[str, str]) -> str:
    """Write the sbatch ``script`` to ``path`` (atomic, never through a planted link) and submit it with ``env`` as
    sbatch's environment; returns the job id."""
    from nemo_muon.launchers import slurm

    write_file(path, script, what="the sbatch script")
    return slurm.submit(path, env)


def await_job(job_id: str, *, timeout_s: float | None = None, progress: bool = True) -> LaunchResult:
    """Wait for the Slurm job (polling squeue at 0.5 s; ``progress``: its state on stderr); Ctrl-C cancels it
    (scancel) and returns state CANCELLED, exit 130."""
    from nemo_muon.launchers import slurm

    try:
        state, code = slurm.wait(job_id, timeout_s=timeout_s, on_poll=_progress(job_id) if progress else None)
    except KeyboardInterrupt:
        slurm.cancel(job_id)
        click.echo(f"\ncancelled slurm job {job_id}", err=True)
        return LaunchResult(job_id=job_id, state="CANCELLED", exit_code=130)
    if progress:
        click.echo(f"\rslurm job {job_id}: {state:<10}", err=True)
    return LaunchResult(job_id=job_id, state=state, exit_code=slurm.exit_status(code))


def options_from_cli(recipe: str, executor: str | None, cluster: str | None, profiles: str | None, nodes: int | None,
                     gpus_per_node: int | None, account: str | None, partition: str | None, time: str | None,
                     image: str | None, container: bool | None, mount: tuple[str, ...], env: tuple[str, ...],
                     overrides: tuple[str, ...], preflight: bool | None = None) -> LaunchOptions:
    """LaunchOptions from the shared click options."""
    return LaunchOptions(recipe=recipe, executor=executor, cluster=cluster, profiles=profiles, nodes=nodes,
                         gpus_per_node=gpus_per_node, account=account, partition=partition, time=time, image=image,
                         container=container, mounts=list(mount), env=list(env), overrides=list(overrides),
                         preflight=preflight)


def _print_recipes(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from nemo_muon.recipes import list_recipes

    click.echo("\n".join(list_recipes()))
    ctx.exit(0)


OVERRIDES_HELP = "Same as a KEY=VALUE argument (repeatable; applied before the arguments)."
DRY_RUN_NAMES = ("--dry-run", "--dryrun")
"""One dry-run spelling for every subcommand (``--dry-run``), NeMo-Run's (``--dryrun``) accepted too."""


def merged_overrides(fn: Any) -> Any:
    """``fn`` taking its recipe overrides as ``overrides``: the ``--set KEY=VALUE`` options, then the ``KEY=VALUE``
    arguments (one syntax for every subcommand: arguments, documented; ``--set``, plan's, accepted too)."""

    @functools.wraps(fn)
    def call(*args: Any, set_overrides: tuple[str, ...] = (), overrides: tuple[str, ...] = (), **kwargs: Any) -> Any:
        return fn(*args, overrides=(*set_overrides, *overrides), **kwargs)

    call = click.option("--set", "set_overrides", multiple=True, metavar="KEY=VALUE", help=OVERRIDES_HELP)(call)
    return click.argument("overrides", nargs=-1)(call)


def launch_options(fn: Any) -> Any:
    """The options launch and bench share (defaults: from the cluster profile, else from the recipe)."""
    fn = merged_overrides(fn)
    decorators = [
        click.option("--list", is_flag=True, is_eager=True, expose_value=False, callback=_print_recipes,
                     help="List the recipe names and exit."),
        click.option("--recipe", required=True, help="Recipe name (--list shows them)."),
        click.option("--executor", type=click.Choice(["local", "slurm", "docker"]), default=None,
                     help="Where to run [default: the cluster profile's, else local]."),
        click.option("--cluster", default=None, help="Cluster profile name from the profiles file."),
        click.option("--profiles", default=None, metavar="FILE",
                     help="Cluster profiles YAML [default: $NEMO_MUON_PROFILES or ~/.config/nemo-muon/clusters.yaml]."),
        click.option("--nodes", type=click.IntRange(min=1), default=None, help="Nodes [default: the recipe's]."),
        click.option("--gpus-per-node", type=click.IntRange(min=1), default=None,
                     help="GPUs (CPU processes on gpu=cpu recipes) per node [default: profile, else the recipe's]."),
        click.option("--account", default=None, help="Slurm account [default: the profile's]."),
        click.option("--partition", default=None, help="Slurm partition [default: the profile's]."),
        click.option("--time", "time_", default=None, help="Slurm time limit [default: the profile's, else 01:00:00]."),
        click.option("--image", default=None, help="Container image [default: the profile's]."),
        click.option("--container/--no-container", default=None,
                     help="Slurm: run in the image with pyxis, or bare on the nodes [default: container]."),
        click.option("--mount", multiple=True, metavar="SRC:DST[:ro]", help="Bind mount (repeatable)."),
        click.option("--env", multiple=True, metavar="NAME[=VALUE]",
                     help="Job variable (repeatable); a bare NAME forwards it from your environment."),
    ]
    for deco in reversed(decorators):
        fn = deco(fn)
    return fn


def usage_error(e: Exception, env_items: tuple[str, ...] = ()) -> click.UsageError:
    """A usage error (exit 2) with every secret value (environment and --env) masked."""
    return click.UsageError(mask_text(str(e), secret_values(os.environ, env_items)))


@click.command("launch")
@launch_options
@click.option(*DRY_RUN_NAMES, "dry_run", is_flag=True,
              help="Print exactly what would be submitted or run; submit nothing.")
@click.option("--wait/--no-wait", default=False, help="Slurm: wait for the job to finish [default: no-wait].")
@click.option("--wait-timeout", type=FINITE_POSITIVE, default=None, metavar="SECONDS",
              help="Stop waiting after this long (the job keeps running) [default: no limit].")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of text.")
@click.option("--preflight/--no-preflight", default=None,
              help="Run `nemo-muon preflight` as the job's first step; the training starts only when it passed "
                   "[default: the recipe's system.preflight, on in the GB300 Muon / SOAP recipes].")
def launch(recipe: str, executor: str | None, cluster: str | None, profiles: str | None, nodes: int | None,
           gpus_per_node: int | None, account: str | None, partition: str | None, time_: str | None,
           image: str | None, container: bool | None, mount: tuple[str, ...], env: tuple[str, ...],
           overrides: tuple[str, ...], dry_run: bool, wait: bool, wait_timeout: float | None, as_json: bool,
           preflight: bool | None) -> None:
    """Launch a recipe locally (torchrun), in docker, or on Slurm; overrides are key=value (trainer.max_steps=10)."""
    opts = options_from_cli(recipe, executor, cluster, profiles, nodes, gpus_per_node, account, partition, time_,
                            image, container, mount, env, overrides, preflight)
    try:
        plan = build_plan(opts)
    except LaunchError as e:
        raise usage_error(e, env) from None
    if dry_run:
        click.echo(json.dumps({**plan.as_json(), "dry_run": True}, indent=2) if as_json else plan.describe(), nl=False)
        return
    if not as_json:
        click.echo(plan.describe(), err=True, nl=False)
    try:
        result = execute(plan, wait=wait, timeout_s=wait_timeout, progress=not as_json)
    except (LaunchError, ValueError) as e:  # ValueError: a file refused (a planted link, a folder that is a file)
        raise usage_error(e, env) from None
    except (RuntimeError, TimeoutError, OSError) as e:
        secrets = [*plan.secrets.values(), *secret_values(os.environ, env)]
        raise click.ClickException(mask_text(str(e), secrets)) from None
    if as_json:
        click.echo(json.dumps({**plan.as_json(), "dry_run": False, "job_id": result.job_id, "state": result.state,
                               "exit_code": result.exit_code}, indent=2))
    elif result.job_id is not None:
        click.echo(f"submitted slurm job {result.job_id}" + (f": {result.state}" if result.state else "")
                   + f"; logs: {plan.run_dir}/slurm-{result.job_id}.out")
    if not result.ok and (result.state is not None or result.exit_code not in (None, 0)):
        sys.exit(result.exit_code or 1)
