"""Which Megatron-Core / emerging-optimizers / NeMo combinations can run which optimizer, decided before launch.

Each rule is a known break measured against the real libraries (docs/megatron_cpu.md): the check is a pure function
of distribution versions, so `nemo-muon doctor` (installed versions), ``--dryrun`` and ``nemo-muon launch``
(installed versions, else the container release's) and `build_config_container` / `build_megatron_optimizer` all
give the same answer and the same message, which names the combination and which package to change.
"""

from __future__ import annotations

import functools
import importlib.metadata
from collections.abc import Mapping
from dataclasses import dataclass

from nemo_muon.registry import names, spec_named
from nemo_muon.versions import MINIMUM_VERSIONS, current_release, get_release, release_numbers

MCORE = "megatron-core"
EMERGING_OPTIMIZERS = "emerging-optimizers"
NEMO = "nemo-toolkit"
CHECKED_DISTRIBUTIONS: tuple[str, ...] = (MCORE, EMERGING_OPTIMIZERS, NEMO)


@dataclass(frozen=True)
class StackProblem:
    """One combination of installed versions that cannot run (an optimizer, or at all)."""

    rule: str
    """Short stable name of the rule (tests and doctor refer to it)."""
    optimizer: str | None
    """The optimizer it breaks ('muon', 'soap'); None = the combination breaks whatever the optimizer."""
    message: str
    """What breaks and where."""
    fix: str
    """Which package to change, to what."""
    engine: str | None = None
    """The Muon engine it breaks ('megatron' = Megatron-Core's own Muon); None = whichever engine."""


def stack_problems(versions: Mapping[str, str | None]) -> list[StackProblem]:
    """Every known break in ``versions`` (distribution name -> version, None = not installed)."""
    mcore, eo, nemo = (None if versions.get(d) is None else release_numbers(versions[d])
                       for d in CHECKED_DISTRIBUTIONS)
    problems: list[StackProblem] = []
    eo_for_core_016 = "install the emerging-optimizers release Megatron-Core 0.16 documents (0.1.x, git tag v0.1.0)"
    if mcore is not None and mcore[:2] == (0, 16):
        if eo is not None and eo[:2] >= (0, 2):
            problems.append(StackProblem(
                "mcore016-muon-emerging-optimizers", "muon",
                f"megatron-core {versions[MCORE]} cannot build its Muon with emerging-optimizers "
                f"{versions[EMERGING_OPTIMIZERS]}: megatron/core/optimizer/muon.py passes use_nesterov= to "
                "OrthogonalizedOptimizer, whose keyword is nesterov= since emerging-optimizers 0.2 (TypeError when "
                "the optimizer is built)",
                f"use optimizer.engine=nemo_muon (nemo-muon's Muon inside Megatron's layer-wise optimizer), or "
                f"{eo_for_core_016}, or use a Megatron-Core >= 0.18 stack (NGC 26.06)", engine="megatron"))
        if eo is None:
            problems.append(StackProblem(
                "mcore016-muon-no-emerging-optimizers", "muon",
                f"megatron-core {versions[MCORE]}'s Muon needs emerging-optimizers, which is not installed",
                f"use optimizer.engine=nemo_muon, or {eo_for_core_016}", engine="megatron"))
    eo_minimum = MINIMUM_VERSIONS[EMERGING_OPTIMIZERS]
    if eo is not None and eo < release_numbers(eo_minimum):
        problems.append(StackProblem(
            "emerging-optimizers-too-old-for-nemo-muon", "muon",
            f"emerging-optimizers {versions[EMERGING_OPTIMIZERS]} cannot run nemo-muon's Muon: "
            "nemo_muon.optim.coefficients imports orthogonalized_optimizers.muon_utils.get_coefficient_iterator, "
            f"which arrives in {eo_minimum} (ImportError when Muon is built)",
            f"install emerging-optimizers >= {eo_minimum} (pip install --no-deps emerging-optimizers==0.3.0; the "
            "nemo-muon image does so where the base's is older: NGC 26.02, 26.04); Megatron-Core 0.16's own Muon then "
            "cannot be built, so keep optimizer.engine=nemo_muon there", engine=DEFAULT_ENGINE))
    if mcore is not None and mcore[:2] < (0, 18):
        problems.append(StackProblem(
            "mcore-soap", "soap",
            f"megatron-core {versions[MCORE]} has no SOAP (OptimizerConfig(optimizer='soap') arrives in 0.18)",
            "use optimizer.engine=nemo_muon (nemo-muon's SOAP inside Megatron's layer-wise optimizer), or a "
            "Megatron-Core >= 0.18 stack (NGC 26.06)", engine="megatron"))
    if nemo is not None and nemo[:2] == (2, 7) and mcore is not None and mcore[:2] >= (0, 19):
        problems.append(StackProblem(
            "nemo27-mcore019", None,
            f"nemo-toolkit {versions[NEMO]} does not run on megatron-core {versions[MCORE]} (measured with 2.7.0, "
            "2.7.3 and 0.19.2): NeMo 2.7 is built against Megatron-Core 0.16; `from nemo.collections import llm` "
            "fails importing megatron.core.inference.model_inference_wrappers.inference_wrapper_config, which 0.19 "
            "removed",
            "install megatron-core 0.16.x beside NeMo 2.7 (the NGC 26.02 stack)"))
    return problems


def installed_versions(distributions: tuple[str, ...] = CHECKED_DISTRIBUTIONS) -> dict[str, str | None]:
    """The installed versions of ``distributions`` (default: those the rules read); None = not installed."""
    out: dict[str, str | None] = {}
    for dist in distributions:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out


def release_versions(tag: str) -> dict[str, str | None]:
    """The versions the nemo-muon image of a container release runs with (`ContainerRelease.image_distributions`)."""
    image = get_release(tag).image_distributions()
    return {dist: image.get(dist) for dist in CHECKED_DISTRIBUTIONS}


DEFAULT_ENGINE = "nemo_muon"
"""`MuonConfig.engine`'s default: what a recipe that does not choose runs."""


def optimizer_engine(opt) -> str | None:  # noqa: ANN001 - an optimizer config (kept import-free)
    """The engine of a Muon / SOAP config ('nemo_muon' / 'megatron'); None for optimizers without one (AdamW)."""
    return getattr(opt, "engine", None)


def problems_for_optimizer(optimizer: str, versions: Mapping[str, str | None], *,
                           engine: str | None = DEFAULT_ENGINE) -> list[StackProblem]:
    """The problems that stop ``optimizer`` (a registered name: 'muon', 'soap', 'adamw', 'normuon', ...) with
    ``engine`` on ``versions``. A rule names an optimizer family (Megatron's name: 'muon', 'soap'), so NorMuon, which
    is our Muon with a normalization, meets Muon's rules; an element-wise optimizer has no engine."""
    spec = spec_named(optimizer)
    family = spec.megatron.bridge_name
    return [p for p in stack_problems(versions) if p.optimizer in (None, family)
            and (p.engine is None or (spec.matrix is not None and p.engine == engine))]


def check_stack(optimizer: str, versions: Mapping[str, str | None], *, where: str,
                engine: str | None = DEFAULT_ENGINE) -> None:
    """Raise a ValueError naming every problem that stops ``optimizer`` on ``versions`` (``where`` says which stack)."""
    problems = problems_for_optimizer(optimizer, versions, engine=engine)
    if problems:
        lines = "\n".join(f"  - [{p.rule}] {p.message}; fix: {p.fix}" for p in problems)
        with_engine = spec_named(optimizer).matrix is not None
        shown = f"optimizer.name={optimizer!r}" + (f" with optimizer.engine={engine!r}" if with_engine else "")
        raise ValueError(f"{shown} cannot run on {where}:\n{lines}")


def check_installed_stack(optimizer: str, engine: str | None = DEFAULT_ENGINE) -> None:
    """Refuse ``optimizer`` (a registered name) where the installed Megatron-Core stack cannot build it.

    The rules run once per process for an (optimizer, engine, installed versions): a Bridge run reaches this from
    its container build and again from Bridge's optimizer setup, which only repeats the first answer (a refusal is
    never remembered: it is raised again)."""
    _check_installed_once(optimizer, engine, tuple(sorted(installed_versions().items())))


@functools.lru_cache(maxsize=64)
def _check_installed_once(optimizer: str, engine: str | None, versions: tuple[tuple[str, str | None], ...]) -> None:
    check_stack(optimizer, dict(versions), where="the installed stack", engine=engine)


def check_recipe_stack(recipe) -> None:  # noqa: ANN001 - a TrainingRecipe (kept import-free)
    """Before launch (``--dryrun`` too): refuse a megatron recipe whose optimizer its stack cannot build.

    The stack is the installed one where Megatron-Core is installed (the container, a login node with it), else
    the container release the job will run in (``$NEMO_MUON_RELEASE`` or the default, with what our image adds).
    """
    if recipe.backend != "megatron":
        return
    versions, where = target_stack()
    check_stack(recipe.optimizer.name, versions, where=where, engine=optimizer_engine(recipe.optimizer))
    bridge, where = target_bridge()
    check_recipe_bridge(recipe, bridge, where=where)


MBRIDGE = "megatron-bridge"


def check_recipe_bridge(recipe, bridge_version: str, *, where: str) -> None:  # noqa: ANN001 - import-free
    """Refuse a megatron recipe that the Bridge ``bridge_version`` cannot build, naming the release, the component and
    the field: a Bridge without a generation (`nemo_muon.megatron.generations`), or a model without a Hugging Face
    config to read (neither ``hf_config`` nor one nemo-muon ships: `nemo_muon.megatron.bridge.hf_config`)."""
    from nemo_muon.megatron.bridge.hf_config import hf_config_folder
    from nemo_muon.megatron.generations import bridge_generation

    bridge_generation(bridge_version)
    try:
        hf_config_folder(recipe)
    except ValueError as e:
        raise ValueError(f"recipe {recipe.name!r} on {where} (megatron-bridge {bridge_version}): {e}") from None


def target_bridge() -> tuple[str, str]:
    """(Bridge version, description) of the stack a megatron run builds its config on: the installed Bridge, else
    the container release's (``$NEMO_MUON_RELEASE`` or the default; a login node with Megatron-Core but no Bridge
    launches into that container)."""
    try:
        return importlib.metadata.version(MBRIDGE), "the installed stack"
    except importlib.metadata.PackageNotFoundError:
        tag = current_release().tag
        return get_release(tag).megatron_bridge, f"the nemo:{tag} container stack"


def target_bridge_stack() -> tuple[str | None, str, str]:
    """(Megatron-Core version, Bridge version, description) of the one stack a megatron run trains on: the installed
    pair where Bridge is installed, else the container release's pair (``$NEMO_MUON_RELEASE`` or the default), never
    an installed Megatron-Core with another release's Bridge."""
    try:
        bridge = importlib.metadata.version(MBRIDGE)
    except importlib.metadata.PackageNotFoundError:
        release = get_release(current_release().tag)
        return release.megatron_core, release.megatron_bridge, f"the nemo:{release.tag} container stack"
    return installed_versions()[MCORE], bridge, "the installed stack"


def target_stack() -> tuple[dict[str, str | None], str]:
    """(versions, description) of the stack a megatron run builds on: the installed one where Megatron-Core is
    installed, else the container release's (``$NEMO_MUON_RELEASE`` or the default, with what our image adds)."""
    installed = installed_versions()
    if installed[MCORE] is not None:
        return installed, "the installed stack"
    tag = current_release().tag
    return release_versions(tag), f"the nemo:{tag} container stack"


def _main(argv: list[str] | None = None) -> int:
    """``python -m nemo_muon.megatron.shared.stack --require muon[,soap,adamw]``: the container build's check.

    Prints every known break of the installed stack; exits 1 when one stops a required optimizer.
    """
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m nemo_muon.megatron.shared.stack", description=_main.__doc__)
    parser.add_argument("--require", default="", help="comma-separated optimizers the image must run "
                        f"({', '.join(names())}); empty = report only")
    args = parser.parse_args(argv)
    required = [o.strip() for o in args.require.split(",") if o.strip()]
    allowed = names()
    bad = [o for o in required if o not in allowed]
    if bad:
        parser.error(f"--require must name optimizers of {allowed}; got {bad}")
    versions = installed_versions()
    problems = stack_problems(versions)
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if v is not None) or "none of " + ", ".join(versions)
    print(f"nemo_muon.megatron.shared.stack: {shown}")
    for p in problems:
        who = (p.optimizer or "any optimizer") + (f" (engine {p.engine!r})" if p.engine else "")
        print(f"  [{p.rule}] {who} cannot run: {p.message}; fix: {p.fix}")
    blocked = sorted({o for o in required if problems_for_optimizer(o, versions)})
    if blocked:
        print(f"nemo_muon.megatron.shared.stack: the image must run {required}, but {blocked} cannot run on this stack "
              f"(build with --build-arg NEMO_MUON_REQUIRE_OPTIMIZERS=<the optimizers it must run> to accept that)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
