"""What the megatron backend refuses, checked when a recipe is built (``--dryrun``, plan, launch, the job): torch-free.

Every rule here is one the backend would hit later, inside the container: Bridge has a library recipe for the model
and a preset for the precision (`bridge.container.check_supported`); its provider, not our `ModelSpec`, sets the
architecture, so a changed ``model.*`` would be ignored silently; MXFP8 needs a Blackwell GPU; Bridge reads mock or
indexed data; the optimizer maps onto the target Megatron-Core's `OptimizerConfig` (`megatron_optimizer_spec` with
that generation's field names: whatever the mapping refuses, split gate/up or ``tp_mode='auto'``, is refused here); the
stack can build the optimizer (`stack.check_recipe_stack`); Bridge's timeout is in whole minutes.
"""

from __future__ import annotations

import dataclasses

from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.models.specs import MODEL_SPECS

MXFP8_GPUS: tuple[str, ...] = ("gb300", "gb200", "b200")
"""GPUs with MXFP8 tensor cores (Blackwell, SM 10.x); Transformer Engine refuses the MXFP8 recipe elsewhere."""
BRIDGE_DATA_KINDS: tuple[str, ...] = ("mock", "indexed")
"""Data the Bridge path reads (mock tokens, a Megatron indexed dataset); stdlib_text is the torch backend's."""


def _check_architecture(recipe: TrainingRecipe) -> None:
    shipped = MODEL_SPECS.get(recipe.model.name)
    if shipped is None:
        return  # bridge.container.check_supported names the models it has a recipe for
    changed = [f.name for f in dataclasses.fields(shipped) if getattr(shipped, f.name) != getattr(recipe.model, f.name)]
    if changed:
        shown = ", ".join(f"{n}={getattr(recipe.model, n)!r}" for n in changed)
        raise ValueError(f"model.{changed[0]} must stay {getattr(shipped, changed[0])!r} for the megatron backend "
                         f"(Bridge's {recipe.model.name} provider sets the architecture, so a change would be ignored);"
                         f" got {shown}")


def check_wiring(recipe: TrainingRecipe, mcore: str | None, bridge: str | None, where: str) -> None:
    """``optimizer.collectives='reduce_scatter'`` and ``optimizer.ns_split_target`` run in our ownership inside
    Megatron's layer-wise optimizer (engine nemo_muon; a split at TP = 1): on Megatron-Core 0.16 / 0.17 in that optimizer
    (`nemo_muon.megatron.core_016_017`), on >= 0.18 in DDP's cost layout (`nemo_muon.megatron.core_018_plus.cost_layout`),
    which only a Bridge generation with a cost-layout entry builds, and a split needs it there. ``mcore`` / ``bridge``:
    the versions of the stack the run trains on (`stack.target_bridge_stack`), described by ``where``."""
    from nemo_muon.megatron.generations import bridge_generation, core_generation

    opt = recipe.optimizer
    target, collectives = getattr(opt, "ns_split_target", None), getattr(opt, "collectives", "all_reduce")
    layout_core = mcore is not None and core_generation(mcore).parameter_layout
    no_layout_bridge = bridge is not None and bridge_generation(bridge).cost_layout is None
    if collectives == "reduce_scatter" and layout_core and no_layout_bridge:
        raise ValueError(f"optimizer.collectives='reduce_scatter' needs, on Megatron-Core {mcore}, a Megatron-Bridge whose "
                         f"DDP wrap nemo-muon lays out (0.5.x / 0.6.x; {where} has Bridge {bridge}); got "
                         "'reduce_scatter': set optimizer.collectives=all_reduce")
    if target is None:
        return
    why = None
    if getattr(opt, "engine", None) != "nemo_muon":
        why = "optimizer.engine='nemo_muon' (Megatron's own Muon owns whole tensors)"
    elif recipe.parallelism.tp != 1:
        why = f"parallelism.tp=1 (a split inside a tensor-parallel shard is not supported; got tp={recipe.parallelism.tp})"
    elif layout_core and collectives != "reduce_scatter":
        why = (f"optimizer.collectives='reduce_scatter' on Megatron-Core {mcore} ({where}: the split lives in DDP's "
               "cost layout)")
    if why is not None:
        raise ValueError(f"optimizer.ns_split_target must be None unless the run uses {why}; got {target!r} "
                         "(optimizer.ns_split_target=none: whole tensors)")


def check_megatron_recipe(recipe: TrainingRecipe) -> None:
    """Raise a ValueError naming the field, the value and what is allowed for anything the megatron backend refuses."""
    from nemo_muon.megatron.bridge.container import bridge_field_overrides, bridge_optimizer_spec, check_supported
    from nemo_muon.megatron.shared.optimizer_config import API_FIELDS, api_for_version
    from nemo_muon.megatron.shared.stack import MCORE, check_recipe_stack, target_bridge_stack, target_stack

    sys_ = recipe.system
    if sys_.gpu == "cpu":
        raise ValueError("system.gpu must be a GPU for the megatron backend (Megatron-Bridge trains on GPUs); got "
                         "'cpu': set backend=torch for CPU runs")
    check_supported(recipe)  # a model family with a Bridge base, a precision with a Bridge preset
    _check_architecture(recipe)
    if recipe.precision.kind == "mxfp8" and sys_.gpu not in MXFP8_GPUS:
        raise ValueError(f"precision.kind='mxfp8' needs system.gpu to be one of {MXFP8_GPUS} (Blackwell); got "
                         f"{sys_.gpu!r}: use precision.kind=fp8_cs or bf16")
    if recipe.data.kind not in BRIDGE_DATA_KINDS:
        raise ValueError(f"data.kind must be one of {BRIDGE_DATA_KINDS} for the megatron backend; got "
                         f"{recipe.data.kind!r}")
    timeout = sys_.collective_timeout
    if timeout % 60:
        raise ValueError(f"system.collective_timeout_s must be a whole number of minutes for the megatron backend "
                         f"(Bridge's dist.distributed_timeout_minutes); got {sys_.collective_timeout_s!r}")
    check_recipe_stack(recipe)
    versions, where = target_stack()
    api = api_for_version(versions[MCORE] or "0.16")
    try:
        bridge_optimizer_spec(recipe, fields=set(API_FIELDS[api]))
    except ValueError as e:
        raise ValueError(f"{e} (Megatron-Core {versions[MCORE]}, {where})") from None
    check_wiring(recipe, *target_bridge_stack())
    bridge_field_overrides(recipe)
