"""NeMo-Run registration (the `nemo_run.cli` entry-point module): `nemo llm pretrain --factory <recipe>`.

What importing this module registers:

* ``pretrain`` under the namespace ``nemo_muon`` always (``nemo nemo_muon pretrain --factory kimi_k2_muon``);
* ``llm pretrain``, in one of two ways:
  - where another package provides the ``llm`` namespace (NeMo 2.7 in NGC 26.02), its ``pretrain`` entrypoint stays
    its own and gains our recipes: ``--factory <one of ours>`` runs our recipe, any other ``--factory`` (NeMo's
    ``llama3_8b``...) or none runs NeMo's command unchanged. The hook is the entrypoint's RunContext class
    (`LlmPretrainRunContext`), our recipes are listed in its ``--help`` and ``nemo llm --help``;
  - elsewhere, our own ``pretrain`` under ``llm``;
* one factory per registered recipe, for each of our pretrain entrypoints (``--factory kimi_k2_muon``);
* the executor factory ``local`` (``run.executor=local``: LocalExecutor with this interpreter's torchrun, 2 ranks by
  default), unless another package provides one.

Overrides use NeMo-Run's syntax but are parsed by `nemo_muon.recipes.overrides` (``optim.lr=3e-4``,
``trainer.max_steps=100``): a bad key or value exits non-zero with one line listing what is valid. A secret on the
command line (``env.HF_TOKEN=...``, ``run.executor.env_vars={'WANDB_API_KEY': ...}``, a URL with a password) is
refused before NeMo-Run prints or records anything, with `nemo-muon launch`'s message: export it instead. ``--dryrun``
prints the fully resolved recipe (and the executor's launch plan); nothing needs a GPU, Bridge or TE (where
Megatron-Core is installed without TE / Apex, its fallback warnings are one line:
`nemo_muon.megatron.shared.fallback_warnings`).
The ``llm`` namespace needs an entry point named ``llm`` in the ``nemo_run.cli`` group pointing here (NeMo-Run only
builds a namespace's commands when the first CLI word is an entry-point name).
"""

import dataclasses
import importlib
import os
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import click
import nemo_run as run
from nemo_muon.recipes import list_recipes
from nemo_muon.recipes.execute import (
    build_recipe,
    check_backend_installed,
    check_new_run_folder,
    describe,
    run_resolved,
)
from nemo_muon.recipes.overrides import check_secret_overrides
from nemo_muon.recipes.resolved import to_document
from nemo_run.cli.api import Entrypoint, RunContext, RunContextError, catalogue
from nemo_run.config import get_type_namespace

from nemo_muon.megatron.shared.fallback_warnings import collapse_fallback_warnings
from nemo_muon.secret_policy import is_secret_name, is_secret_value, override_refusal, python_strings, shown_redacted

# NeMo-Run imports every nemo_run.cli entry point (Bridge's `lm` imports Megatron-Core): where TE / Apex are absent,
# Megatron's dozen fallback warnings and Bridge's logged import tracebacks become one line (for imports after this one)
collapse_fallback_warnings()

PREFLIGHT_NOT_RUN = ("system.preflight=True: this entry point starts the training only; prove the optimizer path on "
                     "the allocation first (`nemo-muon preflight --recipe {recipe} --nproc-per-node <GPUs>`), or "
                     "submit with `nemo-muon launch --recipe {recipe}`, whose job runs it as its first step")
"""What ``nemo llm pretrain`` says for a recipe with ``system.preflight`` (NeMo-Run runs one task)."""
ENTRY_POINT_GROUP = "nemo_run.cli"
OWN_MODULE_PREFIX = "nemo_muon."
RECIPES_PACKAGE = "nemo_muon.recipes"
PASSTHROUGH_KEYS: tuple[str, ...] = ("recipe",)
"""Keys NeMo-Run itself must see (the pretrain entrypoint's own argument)."""


def _foreign_llm_entry_points() -> list[metadata.EntryPoint]:
    eps = metadata.entry_points().select(group=ENTRY_POINT_GROUP, name="llm")
    return sorted((ep for ep in eps if not ep.value.startswith(OWN_MODULE_PREFIX)), key=lambda ep: ep.value)


def foreign_llm_providers() -> list[str]:
    """Entry points named ``llm`` in the nemo_run.cli group that belong to another package (e.g. NeMo 2.7)."""
    return [ep.value for ep in _foreign_llm_entry_points()]


JOINED_RECIPES: set[str] = set()
"""Our recipes that another package's ``llm pretrain`` runs as ours (all of them unless it has a factory so named)."""


def is_joined_factory(factory: str | None) -> bool:
    """True if ``--factory`` given to another package's ``llm pretrain`` means one of our recipes (a joined name or
    ``nemo_muon.recipes.<module>.<recipe>``)."""
    return bool(factory) and (factory in JOINED_RECIPES or factory.startswith(RECIPES_PACKAGE + "."))


def split_cli_args(args: list[str]) -> tuple[list[str], list[str]]:
    """Split NeMo-Run's extra CLI args into (args NeMo-Run handles: ``run.*``, flags, ``recipe=``) and recipe
    overrides (every other ``key=value``)."""
    passthrough, overrides = [], []
    for arg in args:
        key = arg.split("=", 1)[0]
        if arg.startswith("-") or "=" not in arg or key.startswith("run.") or key in PASSTHROUGH_KEYS:
            passthrough.append(arg)
        else:
            overrides.append(arg)
    return passthrough, overrides


def _env_refusal(key: str) -> str:
    return (f"{key}=**** is refused: {key} sets environment variables, so its value must be literal data "
            f"({{'NAME': 'value'}}, dict(NAME='value')) whose names can be checked for secrets; got a computed "
            "expression")


def check_cli_secrets(passthrough: list[str], overrides: list[str]) -> None:
    """Refuse secrets on the command line (the policy of nemo_muon.secret_policy, the message `nemo-muon launch`
    gives): recipe overrides such as ``env.HF_TOKEN=...``, and NeMo-Run arguments that set one
    (``run.executor.env_vars={'HF_TOKEN': ...}``) or carry a credential (``scheme://user:password@host``).

    Decided on what NeMo-Run would parse, not on the text (`secret_policy.python_strings`): a name spelled through
    an escape (``'HF_TOKE\\x4e'``), implicit concatenation, triple quotes, ``+`` or ``dict([...])`` is the name it
    spells; under a key that sets environment variables a computed value (a call, a comprehension, a condition)
    is refused, since what it names cannot be seen without running it."""
    check_secret_overrides(overrides)
    for arg in passthrough:
        key, sep, value = arg.partition("=")
        if not sep:
            continue
        parsed = python_strings(value)
        env_like = "env" in key.lower()
        names = list(parsed.names)
        if env_like:
            names.append(key.rsplit(".", 1)[-1])
        secret = next((n for n in names if is_secret_name(n)), None)
        if secret or is_secret_value(value) or any(is_secret_value(v) for v in parsed.values):
            raise ValueError(override_refusal(key, secret))
        if env_like and parsed.computed:
            raise ValueError(_env_refusal(key))


@dataclasses.dataclass(kw_only=True)
class RecipeRunContext(RunContext):
    """NeMo-Run's RunContext, with recipe overrides kept out of NeMo-Run's own parser and handed to `pretrain`."""

    recipe_overrides: list[str] = dataclasses.field(default_factory=list)

    def cli_execute(self, fn: Callable, args: list[str], entrypoint_type: str = "task") -> None:
        passthrough, self.recipe_overrides = split_cli_args(list(args))
        try:  # before NeMo-Run prints this context (--dryrun) or writes it into its experiment configs
            check_cli_secrets(passthrough, self.recipe_overrides)
        except ValueError as e:
            raise RunContextError(str(e)) from None
        names = list_recipes()
        if self.factory and self.factory.startswith(RECIPES_PACKAGE + "."):
            # a dotted path to one of our factories (nemo_muon.recipes.kimi_k2.kimi_k2_muon) = that recipe
            self.factory = self.factory.rsplit(".", 1)[1]
        if self.factory and "." not in self.factory and self.factory not in names:
            nemo = "" if FOREIGN_LLM else (" (NeMo 2's own recipes, llama3_8b ..., need the NeMo toolkit, NGC 26.02's "
                                           "container; not installed here)")
            raise RunContextError(f"--factory must be one of {tuple(names)}{nemo}; got {shown_redacted(self.factory)}")
        if self.factory in names:
            check_before_launch(self.factory, self.recipe_overrides, passthrough, launching=not self.dryrun)
        if self.dryrun:  # a dry run launches nothing: there is nothing to confirm (and maybe no terminal to ask)
            self.skip_confirmation = True
        elif self.factory in names:
            if not self.skip_confirmation and not _has_terminal():
                raise RunContextError("--yes must be given to launch without a terminal (nothing can answer "
                                      "'Continue?'); got no --yes: add --yes to launch, or --dryrun to print the recipe")
        try:
            super().cli_execute(fn, passthrough, entrypoint_type)
        except click.exceptions.Abort:  # 'Continue?' answered by end of input or Ctrl-C
            raise RunContextError("not launched: 'Continue?' got no answer (add --yes to launch without asking)") \
                from None


def _has_terminal() -> bool:
    """Whether NeMo-Run can ask 'Continue?': a terminal on stdin, or ranks under torchrun (where it never asks)."""
    under_torchrun = os.environ.get("WORLD_SIZE", "1").strip() not in ("", "0", "1")
    return under_torchrun or (sys.stdin is not None and sys.stdin.isatty())


def _runs_here(passthrough: list[str]) -> bool:
    """Whether the task runs on this machine: no ``run.executor=`` (in this process) or the local executor."""
    executors = [a.partition("=")[2] for a in passthrough if a.partition("=")[0].strip() == "run.executor"]
    return not executors or "local" in executors[-1].lower()


def check_before_launch(recipe_name: str, overrides: list[str], passthrough: list[str], *,
                        launching: bool = True) -> None:
    """What would otherwise fail only after NeMo-Run printed its plan (and started the job), refused here in one
    line: a bad override; when ``launching``, also a run folder that already holds a run and a backend this machine
    cannot train (Megatron-Bridge absent) when the task runs here."""
    try:
        recipe = build_recipe(recipe_name, overrides)
        if not launching:
            return
        check_new_run_folder(recipe)
        if _runs_here(passthrough):
            check_backend_installed(recipe)
    except ValueError as e:
        raise RunContextError(str(e)) from None


@dataclasses.dataclass(kw_only=True)
class LlmPretrainRunContext(RecipeRunContext):
    """The RunContext of another package's ``llm pretrain`` (NeMo 2.7's) once our recipes join it.

    ``--factory <one of ours>`` runs our ``pretrain`` entrypoint (our override parser, our ``--dryrun`` print);
    any other factory, or none, goes through NeMo-Run's own `RunContext.cli_execute` with the other package's
    function and arguments, exactly as without nemo-muon.
    """

    def cli_execute(self, fn: Callable, args: list[str], entrypoint_type: str = "task") -> None:
        if is_joined_factory(self.factory):
            super().cli_execute(OWN_PRETRAIN, args, "experiment")
        else:
            RunContext.cli_execute(self, fn, args, entrypoint_type)


def _check_executor_world(executor: Any, world_size: int) -> None:
    if isinstance(executor, run.LocalExecutor) and executor.launcher is not None:
        nprocs = executor.nnodes() * executor.nproc_per_node()
        if nprocs != world_size:
            raise RunContextError(
                f"run.executor starts {nprocs} processes but the recipe's world size is {world_size} "
                f"(system.num_nodes*system.gpus_per_node); set system.gpus_per_node={nprocs} or "
                f"run.executor.ntasks_per_node={world_size}"
            )


def launch(ctx: RunContext, recipe_name: str, overrides: list[str]) -> None:
    """Build (once), print (dry run) or run one recipe: in this process without an executor, else as a NeMo-Run task
    that receives the resolved document (`nemo_muon.recipes.execute.nemo_run_task` loads it on every rank)."""
    try:
        recipe = build_recipe(recipe_name, overrides)
        document = to_document(recipe, source=recipe_name, overrides=overrides)
    except ValueError as e:
        raise RunContextError(str(e)) from None
    executor = getattr(ctx, "executor", None)
    if recipe.system.preflight:  # said, never silently skipped
        _warn(PREFLIGHT_NOT_RUN.format(recipe=recipe_name))
    if ctx.dryrun:
        print(describe(recipe))
    if executor is not None:
        _check_executor_world(executor, recipe.world_size)
        executor.env_vars.update(recipe.env)
        # resolved once, here: every rank loads this plain dict (nemo_muon.recipes.resolved), nothing re-parses
        task = run.Partial(_nemo_run_task_function(), recipe=document)
        run_task(task, executor, name=recipe.name, dryrun=ctx.dryrun, detach=ctx.detach)
    elif not ctx.dryrun:
        code = run_resolved(recipe)
        if code:
            raise SystemExit(code)


def run_task(task: run.Partial, executor: Any, *, name: str, dryrun: bool = False, detach: bool = False) -> None:
    """`run.run` for one task on ``executor``, then its end state: a job that did not succeed is an error (one line,
    exit 1), where `run.run` returns as if it had (NeMo-Run logs ``finished: FAILED`` and ``nemo`` exits 0)."""
    with run.Experiment(title=name, executor=executor) as exp:
        exp.add(task, tail_logs=True, name=name)
        if dryrun:
            exp.dryrun()
            return
        exp.run(detach=detach)
    if detach:
        return
    for job in exp.jobs:
        state = getattr(job, "state", None)
        if getattr(state, "name", str(state)) != "SUCCEEDED":
            raise RunContextError(f"job {job.id} of experiment {exp._id} finished {getattr(state, 'name', state)}; "
                                  f"its logs: {job.executor.job_dir}")


def _nemo_run_task_function() -> Callable:
    from nemo_muon.recipes.execute import nemo_run_task

    return nemo_run_task


def _make_pretrain(namespace: str) -> Callable:
    def pretrain(ctx: run.cli.RunContext, recipe: str = "") -> None:
        """Pretrain a nemo-muon recipe: --factory <recipe> [section.field=value ...] [--dryrun] [--yes]."""
        if not recipe:
            raise RunContextError(f"choose a recipe with --factory, one of {tuple(list_recipes())}")
        launch(ctx, recipe, getattr(ctx, "recipe_overrides", []))

    pretrain.__qualname__ = f"{namespace}_pretrain"  # distinct factory namespaces per entrypoint
    return run.cli.entrypoint(pretrain, namespace=namespace, type="experiment", run_ctx_cls=RecipeRunContext,
                              help=f"Pretrain a nemo-muon recipe ({namespace} namespace).")


def _make_factory(recipe_name: str, entrypoint: Callable) -> Callable[[], run.Partial]:
    def factory() -> run.Partial:
        return run.Partial(entrypoint, recipe=recipe_name)

    factory.__name__ = factory.__qualname__ = recipe_name
    return factory


def _register_executor_factories() -> None:
    from nemo_run.cli.api import catalogue
    from nemo_run.config import get_type_namespace

    try:
        catalogue._get((get_type_namespace(run.LocalExecutor), "local"))
        return  # another package already provides `run.executor=local`: keep theirs
    except catalogue.RegistryError:
        pass

    @run.cli.factory(name="local")
    @run.autoconvert
    def local(ntasks_per_node: int = 2) -> run.LocalExecutor:
        """LocalExecutor launching ``ntasks_per_node`` ranks with torchrun (CPU: gloo; GPU: NCCL)."""
        return run.LocalExecutor(ntasks_per_node=ntasks_per_node, launcher="torchrun",
                                 env_vars={"PATH": interpreter_path()})


def interpreter_path(environ: dict[str, str] | None = None) -> str:
    """PATH with this interpreter's ``bin`` first: NeMo-Run's torchrun launcher runs ``torchrun`` by name, which must
    be this environment's even when the virtualenv is not activated (``.venv/bin/nemo llm pretrain ...``)."""
    path = (os.environ if environ is None else environ).get("PATH", os.defpath)
    bin_dir = str(Path(sys.executable).parent)
    return os.pathsep.join([bin_dir, *(p for p in path.split(os.pathsep) if p and p != bin_dir)])


def _warn(message: str) -> None:
    print(f"nemo-muon: {message}", file=sys.stderr)


def join_foreign_llm_pretrain(entry_points: list[metadata.EntryPoint], recipes: list[str]) -> Entrypoint | None:
    """Add our recipes to another package's ``llm pretrain`` (NeMo 2.7's); None, with a warning, where it has none.

    The hook: the other package's function ``pretrain`` carries NeMo-Run's `Entrypoint` (``fn.cli_entrypoint``, set
    by ``@run.cli.entrypoint``) whose ``run_ctx_cls`` builds the command's RunContext; it becomes
    `LlmPretrainRunContext`, which hands our factories to our entrypoint and everything else back unchanged.
    Our factories are also registered for that function, so ``nemo llm pretrain --help`` lists them.
    """
    entry = None
    for ep in entry_points:
        try:
            module = ep.load()
        except Exception as e:  # NeMo-Run reports the other package's import error itself
            _warn(f"`nemo llm pretrain --factory <nemo-muon recipe>` is unavailable: the llm namespace of {ep.value} "
                  f"failed to import ({type(e).__name__}: {e}); use `nemo nemo_muon pretrain --factory <recipe>`")
            return None
        found = getattr(getattr(module, "pretrain", None), "cli_entrypoint", None)
        if isinstance(found, Entrypoint) and found.namespace == "llm":
            entry = found
            break
    if entry is None:
        _warn(f"{', '.join(ep.value for ep in entry_points)} provides the llm namespace without a NeMo-Run "
              "`pretrain` entrypoint; use `nemo nemo_muon pretrain --factory <recipe>` for nemo-muon recipes")
        return None
    if entry.run_ctx_cls is not RunContext and not issubclass(entry.run_ctx_cls, LlmPretrainRunContext):
        _warn(f"llm pretrain of {entry.fn.__module__} uses its own RunContext ({entry.run_ctx_cls.__qualname__}), "
              "which nemo-muon does not extend; use `nemo nemo_muon pretrain --factory <recipe>`")
        return None
    if entry.run_ctx_cls is RunContext:
        namespace = get_type_namespace(entry.fn)
        theirs = [name for name in recipes if catalogue.check_exists(namespace, name)]
        if theirs:  # never shadow the other package's factories: `--factory <name>` stays theirs
            _warn(f"{entry.fn.__module__} has factories named like nemo-muon recipes {theirs}: `nemo llm pretrain "
                  f"--factory` runs theirs; use `nemo nemo_muon pretrain --factory` for ours")
        joined = [name for name in recipes if name not in theirs]
        JOINED_RECIPES.update(joined)
        entry.run_ctx_cls = LlmPretrainRunContext
        first, sep, rest = entry.help_str.partition("\n")
        entry.help_str = (f"{first} (also nemo-muon's recipes: --factory kimi_k2_muon, ...){sep}{rest}"
                          f"\n\nnemo-muon recipes (--factory): {', '.join(joined)}")
        for name in joined:
            run.cli.factory(_make_factory(name, OWN_PRETRAIN), target=entry.fn, name=name)
        _register_nemo2_optimizer_recipes()
    return entry


def _register_nemo2_optimizer_recipes() -> None:
    """Our NeMo 2 optimizer recipes as NeMo-Run factories (``optim=muon_with_cosine_annealing`` for NeMo's recipes)."""
    try:
        importlib.import_module("nemo_muon.megatron.nemo2")
    except ImportError as e:
        _warn(f"optim=muon_with_cosine_annealing and the other NeMo 2 optimizer recipes are unavailable: {e}")


FOREIGN_LLM = _foreign_llm_entry_points()
OWN_PRETRAIN: Callable = _make_pretrain("nemo_muon")
ENTRYPOINTS: list[Callable] = [OWN_PRETRAIN] if FOREIGN_LLM else [OWN_PRETRAIN, _make_pretrain("llm")]
for _name in list_recipes():
    for _entrypoint in ENTRYPOINTS:
        run.cli.factory(_make_factory(_name, _entrypoint), target=_entrypoint, name=_name)
JOINED_LLM_PRETRAIN: Entrypoint | None = join_foreign_llm_pretrain(FOREIGN_LLM, list_recipes()) if FOREIGN_LLM else None
_register_executor_factories()
