"""The optimizer registry: one `OptimizerSpec` per optimizer, the one place that says which optimizer a config is.

Every part of the house that must know the optimizer asks here: the torch factory (``spec.implementation``), the
layer-wise optimizers and the planner (``spec.matrix``: routing, the update's cost, state bytes), the megatron backend
(``spec.megatron``), the recipes' name tables (`names`, `config_classes`). A config's spec is found by its exact
class, so a config subclassed from a registered one is refused until it is registered itself: it never runs, nor is
costed, as its parent.

Adding an optimizer: one file holding its config and its ``SPEC`` (``nemo_muon/registry/<name>.py``; its update in
``nemo_muon/optim/`` when it is new math). The modules of this package are discovered (`discover`): every one that
defines ``SPEC`` is registered, so nothing here names it. Code outside the package registers with `register`.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any

from nemo_muon._validation import check_choice, fail
from nemo_muon.registry.spec import MatrixSpec, MegatronSpec, OptimizerSpec, resolve


def discover() -> tuple[OptimizerSpec, ...]:
    """The ``SPEC`` of every module of this package that defines one, in the order of the modules' names."""
    found = []
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        spec = getattr(importlib.import_module(f"{__name__}.{info.name}"), "SPEC", None)
        if spec is not None:
            if not isinstance(spec, OptimizerSpec):
                raise ValueError(f"{__name__}.{info.name}.SPEC must be an OptimizerSpec; got {type(spec).__name__}")
            found.append(spec)
    return tuple(found)


BUILTIN: tuple[OptimizerSpec, ...] = discover()
"""The optimizers of this package (`discover`), in the order listings show them."""

_BY_NAME: dict[str, OptimizerSpec] = {}
_BY_CLASS: dict[type, OptimizerSpec] = {}


def register(spec: OptimizerSpec) -> OptimizerSpec:
    """Add ``spec``; raises if its name or config class is taken by another spec, or its config's ``name`` differs."""
    if not dataclasses.is_dataclass(spec.config_class) or "name" not in {f.name for f in
                                                                           dataclasses.fields(spec.config_class)}:
        raise ValueError(f"OptimizerSpec {spec.name!r}: config_class must be an optimizer config dataclass with a "
                         f"'name' field; got {spec.config_class!r}")
    default_name = next(f.default for f in dataclasses.fields(spec.config_class) if f.name == "name")
    if default_name != spec.name:
        raise ValueError(f"OptimizerSpec {spec.name!r}: {spec.config_class.__name__}.name must be {spec.name!r}; got "
                         f"{default_name!r}")
    for table, key in ((_BY_NAME, spec.name), (_BY_CLASS, spec.config_class)):
        taken = table.get(key)
        if taken is not None and taken is not spec:
            raise ValueError(f"optimizer {key!r} is registered already (spec {taken.name!r})")
    _BY_NAME[spec.name] = spec
    _BY_CLASS[spec.config_class] = spec
    return spec


for _spec in BUILTIN:
    register(_spec)


def check_baselines() -> None:
    """Raise unless every registered spec's ``baseline`` is another registered optimizer that is a baseline itself."""
    for spec in _BY_NAME.values():
        if spec.baseline is None:
            continue
        base = _BY_NAME.get(spec.baseline)
        if base is None or base is spec or base.baseline is not None:
            allowed = tuple(s.name for s in _BY_NAME.values() if s.baseline is None and s is not spec)
            raise fail(f"OptimizerSpec {spec.name!r}.baseline", spec.baseline, f"None or one of {allowed}")


check_baselines()


def names() -> tuple[str, ...]:
    """Every registered optimizer's name (recipes' ``optimizer=<name>``), in registration order."""
    return tuple(_BY_NAME)


def specs() -> tuple[OptimizerSpec, ...]:
    """Every registered spec, in registration order."""
    return tuple(_BY_NAME.values())


def config_classes() -> dict[str, type]:
    """name -> config class: the table overrides and recipe documents decode with."""
    return {name: spec.config_class for name, spec in _BY_NAME.items()}


def spec_named(name: str) -> OptimizerSpec:
    """The spec of the optimizer called ``name``; raises naming the registered ones."""
    check_choice("optimizer", name, names())
    return _BY_NAME[name]


def spec_for(config: Any) -> OptimizerSpec:
    """The spec of an optimizer config, by its exact class (a subclass of a registered config is refused)."""
    spec = _BY_CLASS.get(type(config))
    if spec is None:
        registered = ", ".join(cls.__name__ for cls in _BY_CLASS)
        raise ValueError(f"optimizer config {type(config).__name__} is not registered (registered: {registered}): "
                         "register an OptimizerSpec for it with nemo_muon.registry.register; a subclass never runs "
                         "as its parent")
    return spec


def check_split_target(config: Any) -> float | None:
    """The config's ``ns_split_target`` (None without one); raises naming the field if its optimizer's entry does not
    split a matrix's update (``matrix.splittable``), so a target is refused, never ignored."""
    target = getattr(config, "ns_split_target", None)
    matrix = spec_for(config).matrix
    if target is not None and not (matrix is not None and matrix.splittable):
        raise fail(f"{config.name}.ns_split_target", target, f"None: {spec_for(config).label} does not split a "
                   "matrix's update over DP ranks (split ownership is Muon's)")
    return target


def is_registered(config: Any) -> bool:
    """Whether ``config``'s exact class has a spec."""
    return type(config) in _BY_CLASS


__all__ = ["BUILTIN", "MatrixSpec", "MegatronSpec", "OptimizerSpec", "check_baselines", "check_split_target",
           "config_classes", "discover", "is_registered", "names", "register", "resolve", "spec_for", "spec_named",
           "specs"]
