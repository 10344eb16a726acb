"""Build a recipe from its name and overrides, describe it, and run its backend (torch-free until it trains).

Shared by the NeMo-Run entrypoint (`nemo llm pretrain`), executor tasks (`nemo_run_task` is what every rank of a
NeMo-Run launch calls) and the operator CLI. A recipe is resolved once (`build_recipe`); what runs it on a rank is
`run_resolved`, the one launch path every entry point calls.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from nemo_muon.recipes import get_recipe
from nemo_muon.recipes.overrides import apply_overrides
from nemo_muon.recipes.systems import check_layout

from nemo_muon._validation import shown
from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.secret_policy import mask_env
from nemo_muon.train.refusals import RunRefused


def build_recipe(name: str, overrides: Sequence[str] = ()) -> TrainingRecipe:
    """The registered recipe ``name`` with ``overrides`` (``a.b=value`` strings) applied and checked once, completely
    (`nemo_muon.run_checks.check_run`: layout, schedule, shapes, the backend's and the optimizer mapping's rules, the
    stack). Every entry point builds through here, so all accept and refuse the same recipes."""
    from nemo_muon.run_checks import check_run

    recipe = apply_overrides(get_recipe(name), list(overrides))
    check_run(recipe)
    return recipe


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {"kind": value.name} if hasattr(value, "name") and "name" not in _init_names(value) else {}
        return {**out, **{n: _plain(getattr(value, n)) for n in _init_names(value)}}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _init_names(obj: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(obj) if f.init]


def layout_summary(recipe: TrainingRecipe) -> str:
    """One line: system, parallel sizes (DP derived) and batch split, e.g. for the `--dryrun` header."""
    from nemo_muon.accounting.layout import validate_layout

    lay = validate_layout(recipe)
    sys_ = recipe.system
    return (
        f"{recipe.name}: {recipe.world_size} x {sys_.gpu} ({sys_.num_nodes} nodes x {sys_.gpus_per_node}), "
        f"TP{lay.tp} PP{lay.pp} VP{lay.vp} CP{lay.cp} EP{lay.ep} ETP{lay.etp} DP{lay.dp}, "
        f"GBS {recipe.trainer.global_batch_size} MBS {recipe.trainer.micro_batch_size} "
        f"seq {recipe.trainer.seq_length} ({lay.num_microbatches} micro-batches), "
        f"{recipe.optimizer.name} {recipe.precision.kind}, backend {recipe.backend}"
    )


def describe(recipe: TrainingRecipe) -> str:
    """The fully resolved recipe as YAML, headed by its layout summary (secret env values shown as ****)."""
    plain = _plain(recipe)
    plain["env"] = mask_env(plain.get("env") or {})
    body = yaml.safe_dump(plain, sort_keys=False, default_flow_style=False)
    return f"# {layout_summary(recipe)}\n{body}"


METRICS_FILE = "metrics.jsonl"
"""What a run folder holds once a run has started in it (the torch backend's metrics; docs/ARCHITECTURE.md)."""


def run_folder(recipe: TrainingRecipe) -> Path:
    """``<logging.root>/<logging.run_name or the recipe name>``: where the run writes."""
    return Path(recipe.logging.root) / (recipe.logging.run_name or recipe.name)


def check_new_run_folder(recipe: TrainingRecipe) -> None:
    """Refuse, before anything starts, a run folder that already holds a run (unless ``checkpoint.resume``): the
    job would refuse it only after the launch (`nemo-muon launch`, `bench` and `nemo llm pretrain` all check)."""
    folder = run_folder(recipe)
    if (folder / METRICS_FILE).exists() and not recipe.checkpoint.resume:
        raise ValueError(f"logging.run_name must name a new run folder (or set checkpoint.resume=true); "
                         f"{shown(str(folder))} already holds {METRICS_FILE}")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing or broken
        return False


def check_backend_installed(recipe: TrainingRecipe) -> None:
    """Refuse to train here a recipe whose backend this environment lacks (the megatron backend needs
    Megatron-Bridge, the NeMo container's): one line naming the recipe, what is missing and what runs instead."""
    if recipe.backend == "megatron" and not _installed("megatron.bridge"):
        raise RunRefused(
            f"recipe {recipe.name} has backend='megatron', which trains only where Megatron-Bridge is installed (the "
            f"NeMo container, containers/README.md); got no Megatron-Bridge here: print it with `nemo llm pretrain "
            f"--factory {recipe.name} --dryrun`, submit it with `nemo-muon launch --recipe {recipe.name} --executor "
            f"slurm`, or train a torch-backend recipe here (tiny_kimi_k2_muon)")


def backend_pretrain(backend: str) -> Callable[..., Any]:
    """The training function of a backend: 'torch' -> nemo_muon.train.pretrain.pretrain (CPU/GPU, torchrun),
    'megatron' -> nemo_muon.megatron.bridge.container.pretrain (Megatron-Bridge in the NeMo container, one task per GPU)."""
    if backend == "torch":
        from nemo_muon.train.pretrain import pretrain
    elif backend == "megatron":
        from nemo_muon.megatron.bridge.container import pretrain
    else:
        raise ValueError(f"recipe.backend must be one of ('megatron', 'torch'); got {backend!r}")
    return pretrain


def pretrain_recipe(recipe: TrainingRecipe, **kwargs: Any) -> Any:
    """Train ``recipe`` in this process with its backend (``backend_pretrain``)."""
    recipe.validate()
    check_layout(recipe)
    check_backend_installed(recipe)
    return backend_pretrain(recipe.backend)(recipe, **kwargs)


def run_resolved(recipe: TrainingRecipe, **kwargs: Any) -> int:
    """Run this resolved recipe on this rank: the one launch path of NeMo-Run's task (`nemo_run_task`), the job every
    launcher starts (``python -m nemo_muon.launchers.run_recipe``) and ``python -m nemo_muon.train.pretrain``.

    Trains ``recipe`` with its backend (`pretrain_recipe`; ``kwargs`` go to it) and returns the exit code: 0, or a
    refusal of the run (a resume mismatch, divergence, a damaged checkpoint) printed once, by rank 0 (``RANK``), as
    ``error: <one line>`` with its exit code (`nemo_muon.train.refusals.run_or_refuse`)."""
    import os

    from nemo_muon.train.refusals import run_or_refuse

    return run_or_refuse(lambda: pretrain_recipe(recipe, **kwargs), rank=int(os.environ.get("RANK", "0")))


def nemo_run_task(recipe: Mapping[str, Any] | str, overrides: Sequence[str] = ()) -> None:
    """What each rank of a NeMo-Run launch calls: ``recipe`` is the resolved document the launch built
    (`nemo_muon.recipes.resolved`, a plain dict in the task's ``run.Partial``), loaded and checked here, or a
    registered name that is resolved once, here, with ``overrides``. Then `run_resolved`; a refusal ends the rank
    with its exit code (``SystemExit``)."""
    from nemo_muon.recipes.resolved import from_document

    if isinstance(recipe, str):
        resolved = build_recipe(recipe, overrides)
    elif overrides:
        raise ValueError(f"overrides must be empty with a resolved recipe document (it is already resolved); "
                         f"got {list(overrides)!r}")
    else:
        resolved = from_document(recipe)
    code = run_resolved(resolved)
    if code:
        raise SystemExit(code)
