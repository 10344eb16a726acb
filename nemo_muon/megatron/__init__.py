"""nemo_muon.megatron: the Megatron-Core / Megatron-Bridge / NeMo 2 backend.

Submodules load on first attribute access (``nemo_muon.megatron.nemo2.muon_with_wsd``), so importing the package needs none
of Megatron-Core, Bridge or NeMo:

* `optimizer_config`: our optimizer configs -> Megatron-Core's `OptimizerConfig` (both API generations);
* `build`: the Megatron optimizer of a config over DDP-wrapped model chunks;
* `registration`: nemo-muon's Muon inside Megatron-Core's layer-wise distributed optimizer (engine 'nemo_muon');
* `cost_balanced`: on Megatron-Core 0.16, that optimizer owning the matrices by update cost (and split ownership);
* `cost_layout`: on Megatron-Core >= 0.18, DDP's layer-wise parameter layout owned by update cost (reduce-scatter);
* `owner_reduce`, `owner_gather`: on Megatron-Core 0.16 / 0.17, gradients reduced to their owners and parameters
  all-gathered in the next forward (instead of DDP's all-reduce and the step's all-gather);
* `split_plan`: on Megatron-Core >= 0.18 with a split target, the stage's ownership plan that layout encodes;
* `split_shares`: on Megatron-Core >= 0.18, our Muon's block shares of the matrices that layout split;
* `bridge_layout`: that layout inside Megatron-Bridge 0.5 / 0.6's own DDP wrap (a pinned hook point);
* `state_checkpoint`: our optimizers' state of any shape through Megatron's ``dist_checkpointing`` (keyed by parameter);
* `checkpoint_files`: a checkpoint with a missing or truncated file refused by name before a resume reads it;
* `class_switch`: an object Megatron built, switched to a same-named subclass of its own class;
* `nonfinite`: the skip / raise decision on the global gradient norm (engine 'nemo_muon');
* `bridge_provider`: that engine in Megatron-Bridge >= 0.4, through ``OptimizerConfig.provide()`` (imports Bridge);
* `bridge_hook`: that engine in Megatron-Bridge 0.3 (NGC 26.02), by rebinding one name of its optimizer setup;
* `stack`: which installed stacks can build which optimizer;
* `recipe_rules`: what the megatron backend refuses, checked when a recipe is built (torch-free);
* `model_config`, `bridge`: Megatron-Bridge configs of the recipes; `bridge_presets`: Bridge 0.3's perf layouts as
  data; `bridge_perf_recipes`: Bridge 0.6's perf recipes as the base (a local HF config for the model);
* `nemo2`: NeMo 2.7 optimizer modules and optimizer recipes (needs NeMo).
"""

from __future__ import annotations

import importlib
from typing import Any

SUBMODULES: tuple[str, ...] = ("bridge", "bridge_hook", "bridge_layout", "bridge_perf_recipes", "bridge_presets",
                               "bridge_provider", "build", "model_config", "nemo2", "nonfinite", "optimizer_config",
                               "checkpoint_files", "cost_balanced", "cost_layout", "recipe_rules", "registration",
                               "split_plan", "split_shares", "stack", "state_checkpoint", "class_switch",
                               "owner_reduce", "owner_gather")


def __getattr__(name: str) -> Any:
    if name in SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
