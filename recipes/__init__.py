"""Recipe factories and their registry (importable as ``nemo_muon.recipes``).

Discovery convention (every recipe module follows it; nothing is listed by hand):

* Every module of this package whose name does not start with ``_`` is imported on the first call of
  `get_recipe` / `list_recipes` / `recipe_factories`, except `nemo_run_registration` (it imports NeMo-Run and
  registers these factories with it). Recipe modules must stay light: no torch import at module level.
* A factory is a public function decorated with ``@recipe`` (``from nemo_muon.recipes import recipe``). It takes
  no required arguments and returns a `TrainingRecipe` whose ``name`` equals the function name. The registry
  checks both when the recipe is built.
* Names are unique across modules: a second factory with the same name raises at discovery, naming both modules.

    from nemo_muon.recipes import recipe

    @recipe
    def tiny_kimi_k2_muon() -> TrainingRecipe:
        return TrainingRecipe(name="tiny_kimi_k2_muon", model=TINY_KIMI_K2, ...)
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nemo_muon.config.recipe import TrainingRecipe

RecipeFactory = Callable[[], "TrainingRecipe"]

NON_RECIPE_MODULES: frozenset[str] = frozenset({"nemo_run_registration"})
"""Modules of this package that discovery never imports."""

_FACTORIES: dict[str, RecipeFactory] = {}
_DISCOVERED = False


def recipe[F: Callable[..., object]](fn: F) -> F:
    """Register ``fn`` as a recipe factory under its function name (duplicates raise)."""
    name = fn.__name__
    if name.startswith("_"):
        raise ValueError(f"recipe factory name must be public (no leading '_'); got {name!r}")
    previous = _FACTORIES.get(name)
    if previous is not None and previous is not fn:
        raise ValueError(
            f"recipe name {name!r} is registered twice: {previous.__module__}.{name} and {fn.__module__}.{name}"
        )
    _FACTORIES[name] = fn  # type: ignore[assignment]
    return fn


def _discover() -> None:
    global _DISCOVERED
    if _DISCOVERED:
        return
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_") or info.name in NON_RECIPE_MODULES:
            continue
        importlib.import_module(f"{__name__}.{info.name}")
    _DISCOVERED = True


def recipe_factories() -> dict[str, RecipeFactory]:
    """Every registered factory by name (discovers the recipe modules on first use)."""
    _discover()
    return dict(sorted(_FACTORIES.items()))


def list_recipes() -> list[str]:
    """Sorted names of every registered recipe."""
    return list(recipe_factories())


def get_recipe(name: str) -> TrainingRecipe:
    """Build the recipe ``name`` (a fresh, validated object each call)."""
    from nemo_muon.config.recipe import TrainingRecipe

    factories = recipe_factories()
    if name not in factories:
        raise ValueError(f"recipe must be one of {tuple(factories)}; got {name!r}")
    built = factories[name]()
    if not isinstance(built, TrainingRecipe):
        raise TypeError(f"recipe factory {name!r} must return a TrainingRecipe; got {type(built).__name__}")
    if built.name != name:
        raise ValueError(f"recipe factory {name!r} must return a recipe named {name!r}; got name={built.name!r}")
    built.validate()
    return built


__all__ = ["NON_RECIPE_MODULES", "RecipeFactory", "get_recipe", "list_recipes", "recipe", "recipe_factories"]
