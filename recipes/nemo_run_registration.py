"""NeMo-Run registration (the `nemo_run.cli` entry-point module): `nemo llm pretrain --factory <recipe>`.

What importing this module registers:

* ``pretrain`` under the namespace ``nemo_muon`` always (``nemo nemo_muon pretrain --factory kimi_k2_muon``), and
  under ``llm`` only where no other package provides the ``llm`` namespace. Where NeMo 2.7's ``llm`` is installed
  (NGC 26.02), its entrypoints are left alone and our recipes run through ``nemo nemo_muon pretrain``.
* one factory per registered recipe, for each of our pretrain entrypoints (``--factory kimi_k2_muon``);
* the executor factory ``local`` (``run.executor=local``: LocalExecutor with torchrun, 2 ranks by default).

Overrides use NeMo-Run's syntax but are parsed by `nemo_muon.recipes.overrides` (``optim.lr=3e-4``,
``trainer.max_steps=100``): a bad key or value exits non-zero with one line listing what is valid. ``--dryrun``
prints the fully resolved recipe (and the executor's launch plan); nothing needs a GPU, Bridge or TE.
The ``llm`` namespace needs an entry point named ``llm`` in the ``nemo_run.cli`` group pointing here (NeMo-Run only
builds a namespace's commands when the first CLI word is an entry-point name).
"""

import dataclasses
from collections.abc import Callable
from importlib import metadata
from typing import Any

import nemo_run as run
from nemo_muon.recipes import list_recipes
from nemo_muon.recipes.execute import build_recipe, describe, pretrain_recipe
from nemo_run.cli.api import RunContext, RunContextError

ENTRY_POINT_GROUP = "nemo_run.cli"
OWN_MODULE_PREFIX = "nemo_muon."
RECIPES_PACKAGE = "nemo_muon.recipes"
PASSTHROUGH_KEYS: tuple[str, ...] = ("recipe",)
"""Keys NeMo-Run itself must see (the pretrain entrypoint's own argument)."""


def foreign_llm_providers() -> list[str]:
    """Entry points named ``llm`` in the nemo_run.cli group that belong to another package (e.g. NeMo 2.7)."""
    eps = metadata.entry_points().select(group=ENTRY_POINT_GROUP, name="llm")
    return sorted(ep.value for ep in eps if not ep.value.startswith(OWN_MODULE_PREFIX))


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


@dataclasses.dataclass(kw_only=True)
class RecipeRunContext(RunContext):
    """NeMo-Run's RunContext, with recipe overrides kept out of NeMo-Run's own parser and handed to `pretrain`."""

    recipe_overrides: list[str] = dataclasses.field(default_factory=list)

    def cli_execute(self, fn: Callable, args: list[str], entrypoint_type: str = "task") -> None:
        passthrough, self.recipe_overrides = split_cli_args(list(args))
        names = list_recipes()
        if self.factory and self.factory.startswith(RECIPES_PACKAGE + "."):
            # a dotted path to one of our factories (nemo_muon.recipes.kimi_k2.kimi_k2_muon) = that recipe
            self.factory = self.factory.rsplit(".", 1)[1]
        if self.factory and "." not in self.factory and self.factory not in names:
            raise RunContextError(f"--factory must be one of {tuple(names)}; got {self.factory!r}")
        super().cli_execute(fn, passthrough, entrypoint_type)


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
    """Build, print (dry run) or run one recipe: in this process without an executor, else as a NeMo-Run task."""
    try:
        recipe = build_recipe(recipe_name, overrides)
    except ValueError as e:
        raise RunContextError(str(e)) from None
    executor = getattr(ctx, "executor", None)
    if ctx.dryrun:
        print(describe(recipe))
    if executor is not None:
        _check_executor_world(executor, recipe.world_size)
        executor.env_vars.update(recipe.env)
        task = run.Partial(_run_recipe_task(), recipe=recipe_name, overrides=list(overrides))
        run.run(task, executor=executor, name=recipe.name, dryrun=ctx.dryrun, detach=ctx.detach)
    elif not ctx.dryrun:
        pretrain_recipe(recipe)


def _run_recipe_task() -> Callable:
    from nemo_muon.recipes.execute import run_recipe

    return run_recipe


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
        return run.LocalExecutor(ntasks_per_node=ntasks_per_node, launcher="torchrun")


NAMESPACES: tuple[str, ...] = ("nemo_muon",) if foreign_llm_providers() else ("nemo_muon", "llm")
ENTRYPOINTS: list[Callable] = [_make_pretrain(ns) for ns in NAMESPACES]
for _name in list_recipes():
    for _entrypoint in ENTRYPOINTS:
        run.cli.factory(_make_factory(_name, _entrypoint), target=_entrypoint, name=_name)
_register_executor_factories()
