"""Turn launch options (command line + cluster profile + recipe) into a checked LaunchPlan: exactly what will run.

Nothing here submits or runs anything; ``launch.py`` executes a plan. Every problem with the input raises
``LaunchError`` (a ValueError) naming the option, the value and what is allowed, before anything is written.
Torch-free.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_muon.launchers.docker import docker_argv
from nemo_muon.launchers.launch_input import LaunchError, parse_env, parse_mount
from nemo_muon.launchers.profiles import EXECUTORS, ClusterProfile, get_profile
from nemo_muon.launchers.run_recipe import LAUNCH_ENV_VAR
from nemo_muon.launchers.slurm import SlurmJob, render_sbatch, sbatch_argv
from nemo_muon.recipes.execute import check_new_run_folder
from nemo_muon.recipes.resolved import document_path, to_document

from nemo_muon._validation import shown
from nemo_muon.secret_policy import MASK, is_secret_value, split_secrets

ENTRY_MODULE = "nemo_muon.launchers.run_recipe"
TORCHRUN_MODULE = "nemo_muon.launchers.torchrun"
"""torchrun, where a refused run ends as rank 0's one line and the refusal's exit code (`launchers.torchrun`)."""
PREFLIGHT_MODULE = "nemo_muon.preflight.main"
PREFLIGHT_FOLDER = "preflight"
"""The job's preflight reports, inside its run folder."""
DOCKER_MASTER_PORT = 29500
MULTI_NODE_DOCKER_VARS: tuple[str, ...] = ("PET_NODE_RANK", "PET_MASTER_ADDR")
"""Set on each node for a multi-node docker run (torchrun reads --node-rank / --master-addr from them)."""


@dataclass(kw_only=True)
class LaunchOptions:
    """What the user asked for; None = take it from the cluster profile, else from the recipe."""

    recipe: str
    executor: str | None = None
    nodes: int | None = None
    gpus_per_node: int | None = None
    account: str | None = None
    partition: str | None = None
    time: str | None = None
    image: str | None = None
    container: bool | None = None
    mounts: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)
    """``NAME=value`` sets a variable; a bare ``NAME`` forwards it from the current environment."""
    overrides: list[str] = field(default_factory=list)
    cluster: str | None = None
    profiles: str | None = None
    dependency: str | None = None
    preflight: bool | None = None
    """Run `nemo-muon preflight` as the job's first step (None: the recipe's ``system.preflight``)."""


@dataclass(kw_only=True)
class LaunchPlan:
    """A checked, fully rendered launch (run it with nemo_muon.launchers.launch.execute)."""

    executor: str
    recipe_name: str
    recipe: Any
    overrides: list[str]
    run_dir: Path
    env: dict[str, str]
    """Variables set for the job and shown in full."""
    secrets: dict[str, str]
    """Secret variables: passed through the child environment, shown as ****."""
    argv: list[str]
    """The command that is executed here (torchrun / docker run / sbatch)."""
    document: dict[str, Any] = field(default_factory=dict)
    """The resolved recipe (`nemo_muon.recipes.resolved`) every rank loads: nothing re-parses the overrides."""
    recipe_file: Path | None = None
    """Where `execute` writes ``document`` before it starts anything (the job's ``--recipe-file``)."""
    script: str | None = None
    script_path: Path | None = None
    preflight_argv: list[str] | None = None
    """Local / docker: the preflight command run before ``argv`` (Slurm: the script's first step); None: none."""

    @property
    def preflight_dir(self) -> Path:
        """Where the job's preflight writes preflight.json and preflight.md."""
        return self.run_dir / PREFLIGHT_FOLDER

    def write_recipe_file(self) -> Path:
        """Write the resolved recipe document to ``recipe_file`` (atomically); returns its path."""
        from nemo_muon.recipes.resolved import write_document

        assert self.recipe_file is not None
        return write_document(self.recipe_file, self.document)

    def process_env(self) -> dict[str, str]:
        """The environment of the process we start: ours + the job's variables (secrets included)."""
        return {**os.environ, **self.env, **self.secrets}

    def command_text(self, argv: list[str] | None = None) -> str:
        """The command (``argv``, default the run's) as a shell line, secrets masked; local runs show every variable
        they set."""
        shown = dict(self.env) if self.executor == "local" else {}
        shown.update({k: MASK for k in self.secrets})
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in shown.items())
        return (prefix + " " if prefix else "") + shlex.join(self.argv if argv is None else argv)

    def _commands_text(self, run_line: str) -> str:
        """``# run:`` and the command, after the preflight's command where there is one."""
        if self.preflight_argv is None:
            return f"{run_line}\n{self.command_text()}\n"
        return (f"# step 1: nemo-muon preflight (report: {self.preflight_dir}/preflight.md):\n"
                f"{self.command_text(self.preflight_argv)}\n# step 2, only when the preflight passed (exit 0), "
                f"{run_line.removeprefix('# ')}\n{self.command_text()}\n")

    def describe(self) -> str:
        """Human-readable, exact description of what would be submitted or run (secrets masked)."""
        source = shlex.join([self.recipe_name, *self.overrides]).replace("\n", "\\n")
        head = f"# recipe {source}\n# resolved once into {self.recipe_file} (written at launch; every rank loads it)\n"
        if self.script is not None:
            return (f"{head}# sbatch script ({self.script_path}):\n{self.script}\n# submit:\n{self.command_text()}\n")
        nodes = self.recipe.system.num_nodes
        if self.executor == "docker" and nodes > 1:
            return head + self._commands_text(f"# run on each of the {nodes} nodes, with PET_NODE_RANK=0..{nodes - 1} "
                                              "and PET_MASTER_ADDR=<node 0>:")
        return head + self._commands_text("# run:")

    def as_json(self) -> dict[str, Any]:
        return {"executor": self.executor, "recipe": self.recipe_name, "overrides": self.overrides,
                "run_dir": str(self.run_dir), "env": self.env, "secrets": {k: MASK for k in self.secrets},
                "recipe_file": str(self.recipe_file) if self.recipe_file else None, "document": self.document,
                "command": self.command_text(), "script": self.script,
                "preflight_command": None if self.preflight_argv is None else self.command_text(self.preflight_argv),
                "script_path": str(self.script_path) if self.script_path else None}


def _pick(option: Any, profile: ClusterProfile | None, key: str, default: Any = None) -> Any:
    if option is not None:
        return option
    if profile is not None and getattr(profile, key) is not None:
        return getattr(profile, key)
    return default


def _resolve_recipe(opts: LaunchOptions, profile: ClusterProfile | None) -> tuple[Any, list[str]]:
    from nemo_muon.recipes import get_recipe, list_recipes
    from nemo_muon.recipes.execute import build_recipe
    from nemo_muon.recipes.overrides import apply_overrides, check_secret_overrides

    from nemo_muon.accounting.layout import LayoutError

    names = list_recipes()
    if opts.recipe not in names:
        raise LaunchError(f"--recipe must be one of {tuple(names)}; got {shown(opts.recipe)}")
    base = get_recipe(opts.recipe)
    if profile is not None and profile.system is not None and base.system.gpu != profile.system:
        # before the layout: the profile's GPUs per node would only make the recipe's layout fail
        picks = recipes_for_gpu(opts.recipe, profile.system)
        pick = f"pick a recipe for {profile.system}: {', '.join(picks)}" if picks else \
            f"no recipe of {base.model.name} with {base.optimizer.name} is made for {profile.system}"
        raise LaunchError(f"--recipe {opts.recipe} runs on system.gpu={base.system.gpu!r}, but cluster "
                          f"{profile.name!r} has system {profile.system!r}; {pick}")
    overrides = list(opts.overrides)
    try:
        check_secret_overrides(overrides)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    if opts.preflight is not None:
        given = [o for o in overrides if o.split("=", 1)[0].strip() == "system.preflight"]
        if given:
            raise LaunchError(f"--{'' if opts.preflight else 'no-'}preflight and {shown(given[-1])} both set "
                              "system.preflight; pass one of them")
        if opts.preflight != base.system.preflight:
            overrides.append(f"system.preflight={str(opts.preflight).lower()}")
    gpus_per_node = _pick(opts.gpus_per_node, profile, "gpus_per_node")
    if opts.nodes is not None and opts.nodes != base.system.num_nodes:
        overrides.append(f"system.num_nodes={opts.nodes}")
    if gpus_per_node is not None and gpus_per_node != base.system.gpus_per_node:
        overrides.append(f"system.gpus_per_node={gpus_per_node}")
    try:  # the one validation every entry point runs (nemo_muon.run_checks.check_run)
        recipe = build_recipe(opts.recipe, overrides)
    except LayoutError as e:
        recipe = apply_overrides(base, overrides)
        sys_, par = recipe.system, recipe.parallelism
        raise LaunchError(
            f"--nodes x --gpus-per-node = {sys_.num_nodes} x {sys_.gpus_per_node} = {sys_.world_size} GPUs does not "
            f"fit recipe {opts.recipe}'s layout (tp={par.tp} pp={par.pp} cp={par.cp} ep={par.ep}): {e}") from None
    except ValueError as e:
        raise LaunchError(str(e)) from None
    if profile is not None and profile.system is not None and recipe.system.gpu != profile.system:  # an override
        raise LaunchError(f"system.gpu must be the cluster's {profile.system!r} on cluster {profile.name!r}; got "
                          f"{recipe.system.gpu!r}")
    root = Path(recipe.logging.root).expanduser().absolute()
    if str(root) != recipe.logging.root:
        try:
            recipe = apply_overrides(recipe, [f"logging.root={root}"])
        except ValueError as e:
            raise LaunchError(f"{e} (logging.root={shown(recipe.logging.root)} resolved against the current folder)") \
                from None
        overrides.append(f"logging.root={root}")
    return recipe, overrides


def recipes_for_gpu(recipe: str, gpu: str) -> list[str]:
    """The recipes of ``recipe``'s model and optimizer made for ``gpu``; first those whose name differs from
    ``recipe``'s only in the GPU token (``kimi_k2_muon_b200`` on gb300 -> ``kimi_k2_muon``)."""
    from nemo_muon.recipes import get_recipe, list_recipes

    from nemo_muon.config.recipe import GPUS

    def bare(name: str) -> list[str]:
        return [token for token in name.split("_") if token not in GPUS]

    base = get_recipe(recipe)
    found = [name for name in list_recipes() if (other := get_recipe(name)).system.gpu == gpu
             and other.model.name == base.model.name and other.optimizer.name == base.optimizer.name]
    return sorted(found, key=lambda name: (bare(name) != bare(recipe), name))


def _next_script_path(run_dir: Path, job_name: str) -> Path:
    """The first ``<job>-<n>.sbatch`` name not taken by anything, a dangling symbolic link included."""
    n = 1
    while os.path.lexists(run_dir / f"{job_name}-{n}.sbatch"):
        n += 1
    return run_dir / f"{job_name}-{n}.sbatch"


def _refuse_credentials(options: dict[str, str | None]) -> None:
    """Refuse an option value that carries a credential (``user:password@registry/...``): it would be printed
    (--dry-run) and written into the script (`secret_policy.is_secret_value`, decided on the parsed value)."""
    for option, value in options.items():
        if isinstance(value, str) and is_secret_value(value):
            raise LaunchError(f"{option}=**** is refused: {option} must not carry a credential (no 'user:password' before an '@', "
                              "no token); log in to the registry (enroot / docker credentials) and name the image "
                              "without it")


def _preflight_args(recipe: Any, name: str, overrides: list[str], recipe_file: Path, run_dir: Path) -> list[str] | None:
    """The preflight program's arguments (after ``python``), checked as the job will run them; None without
    ``system.preflight``. The pipeline and expert-parallel sizes are the recipe's scaled to the tiny model on the
    job's ranks (`nemo_muon.preflight.request.allocation_pp`, ``allocation_ep``)."""
    if not recipe.system.preflight:
        return None
    from nemo_muon.preflight.request import PreflightRequest

    world = recipe.system.world_size
    out_dir = str(run_dir / PREFLIGHT_FOLDER)
    try:  # pp, ep None: the recipe's, scaled to the job's ranks
        request = PreflightRequest(recipe=name, world_size=world, overrides=tuple(overrides), resolved=recipe,
                                   pp=None, ep=None, out_dir=out_dir)
    except ValueError as e:
        raise LaunchError(f"{e} (system.preflight=True: set system.preflight=false, or --no-preflight)") from None
    return ["-m", PREFLIGHT_MODULE, "--recipe-file", str(recipe_file), "--out", out_dir, "--pp", str(request.pp),
            "--ep", str(request.ep)]


def build_plan(opts: LaunchOptions, environ: dict[str, str] | None = None) -> LaunchPlan:
    """Check everything and render the exact command/script; raises LaunchError on bad input."""
    environ = dict(os.environ) if environ is None else environ
    try:
        profile = get_profile(opts.cluster, opts.profiles) if opts.cluster else None
    except ValueError as e:
        raise LaunchError(str(e)) from None
    executor = _pick(opts.executor, profile, "executor", "local")
    if executor not in EXECUTORS:
        raise LaunchError(f"--executor must be one of {EXECUTORS}; got {shown(executor)}")
    mounts = [parse_mount(m) for m in [*(profile.mounts if profile else []), *opts.mounts]]
    recipe, overrides = _resolve_recipe(opts, profile)
    run_name = recipe.logging.run_name or recipe.name  # one folder name: the config checks it (limits.RUN_NAME)
    root = Path(recipe.logging.root)
    run_dir = root / run_name
    if run_dir.is_symlink():  # the run writes into its own folder, never through a link planted there
        raise LaunchError(f"logging.run_name must name a run folder, not a symbolic link; got {shown(str(run_dir))} "
                          f"-> {shown(os.readlink(run_dir))}")
    try:
        check_new_run_folder(recipe)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    env_all = {**recipe.env, **(profile.env if profile else {}), **parse_env(opts.env, environ)}
    plain, secrets = split_secrets(env_all)
    if plain or secrets:  # the job records these names (values of secrets masked) in launch.json
        plain[LAUNCH_ENV_VAR] = ",".join([*plain, *secrets])
    nodes, gpn = recipe.system.num_nodes, recipe.system.gpus_per_node
    try:  # resolved once: every rank loads this document, nothing re-parses the overrides
        document = to_document(recipe, source=opts.recipe, overrides=overrides)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    recipe_file = document_path(run_dir, document)
    job_args = ["-m", ENTRY_MODULE, "--recipe-file", str(recipe_file)]
    preflight_args = _preflight_args(recipe, opts.recipe, overrides, recipe_file, run_dir)
    image = _pick(opts.image, profile, "image")
    _refuse_credentials({"--image": image, "--account": opts.account, "--partition": opts.partition})
    common = dict(executor=executor, recipe_name=opts.recipe, recipe=recipe, overrides=overrides, run_dir=run_dir,
                  env=plain, secrets=secrets, document=document, recipe_file=recipe_file)
    if executor == "local" and nodes != 1:
        raise LaunchError(f"--nodes must be 1 with --executor local (this machine); got {nodes}")
    if executor == "local":
        def local(args: list[str]) -> list[str]:
            return [sys.executable, "-m", TORCHRUN_MODULE, "--standalone", "--nproc-per-node", str(gpn), *args]
        return LaunchPlan(**common, argv=local(job_args),
                          preflight_argv=None if preflight_args is None else local(preflight_args))
    if executor == "docker":
        if not image:
            raise LaunchError("--image must name the container image for --executor docker (or set image in the "
                              "cluster profile); got none")
        mounts = [*mounts, f"{root}:{root}"]
        forwarded = list(secrets)
        if nodes == 1:
            rdzv = ["--standalone"]
        else:  # one such command per node; torchrun reads the node's rank and the master from PET_* variables
            rdzv = ["--nnodes", str(nodes), "--master-port", str(DOCKER_MASTER_PORT)]
            forwarded += list(MULTI_NODE_DOCKER_VARS)
        def docker(args: list[str]) -> list[str]:
            return docker_argv(image=image, mounts=mounts, env=plain, forwarded_env=forwarded, workdir=str(root),
                               gpus=recipe.system.gpu != "cpu", host_network=nodes > 1,
                               command=["python", "-m", TORCHRUN_MODULE, *rdzv, "--nproc-per-node", str(gpn), *args])
        try:
            return LaunchPlan(**common, argv=docker(job_args),
                              preflight_argv=None if preflight_args is None else docker(preflight_args))
        except ValueError as e:
            raise LaunchError(str(e)) from None
    container = _pick(opts.container, profile, "container", True)
    if container:
        mounts = [*mounts, f"{root}:{root}"]
    job_name = f"nemo-muon-{opts.recipe}"
    try:
        job = SlurmJob(job_name=job_name, nodes=nodes, gpus_per_node=gpn, gpu=recipe.system.gpu,
                       command=job_args, python="python" if container else sys.executable,
                       launcher="torchrun" if recipe.backend == "torch" else "tasks", output_dir=run_dir,
                       workdir=root, account=_pick(opts.account, profile, "account"),
                       partition=_pick(opts.partition, profile, "partition"),
                       time=_pick(opts.time, profile, "time", "01:00:00"), container=container, image=image,
                       mounts=mounts, env=plain, forwarded_env=list(secrets), dependency=opts.dependency,
                       preflight=preflight_args)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    script_path = _next_script_path(run_dir, job_name)
    header = f"Generated by nemo-muon launch --recipe {opts.recipe} --executor slurm"
    return LaunchPlan(**common, argv=sbatch_argv(script_path), script=render_sbatch(job, header=header),
                      script_path=script_path)
