"""nemo_muon.megatron: the Megatron-Core / Megatron-Bridge / NeMo 2 backend, a folder per generation.

`generations` is the one table of the supported Megatron-Core and Megatron-Bridge generations: which folder serves
which versions and the entry points the shared code calls. Deleting a generation is deleting its folder and its row.

* ``shared/``: what every generation shares: our optimizers as Megatron's engine class (`engine`), the step-level
  non-finite policy, the checkpoint wrappers and files, the optimizer-config mapping, the stack and recipe rules, the
  update-cost items of ownership, the build (`build`, by generation);
* ``core_016_017/``: Megatron-Core 0.16 / 0.17 (NGC 26.02 / 26.04): the layer-wise assembly, ownership by cost,
  gradients reduced to owners, parameters gathered in the next forward;
* ``core_018_plus/``: Megatron-Core >= 0.18 (NGC 26.06 onwards): the emerging-optimizer registry entry, DDP's cost
  layout, the stage's split plan and its block shares;
* ``bridge/``: every Megatron-Bridge generation: recipe -> ``ConfigContainer`` -> ``pretrain``, the perf presets, the
  Hugging Face configs Bridge >= 0.4 builds models from;
* ``bridge_03/`` (Bridge 0.3: library recipe, perf-script fields, the engine hook), ``bridge_04_plus/`` (Bridge
  >= 0.4: ``provide()``), ``bridge_05_06/`` (Bridge 0.5 / 0.6: the cost layout in Bridge's DDP wrap), ``bridge_06/``
  (Bridge 0.6: its perf recipes as the base);
* `nemo2`: NeMo 2.7 optimizer modules and optimizer recipes (NGC 26.02; needs NeMo).

Importing the package needs none of Megatron-Core, Bridge or NeMo; submodules load on first attribute access
(``nemo_muon.megatron.nemo2.muon_with_wsd``).
"""

from __future__ import annotations

import importlib
from typing import Any

SUBMODULES: tuple[str, ...] = ("generations", "nemo2", "shared", "core_016_017", "core_018_plus", "bridge",
                               "bridge_03", "bridge_04_05", "bridge_04_plus", "bridge_05_06", "bridge_06")


def __getattr__(name: str) -> Any:
    if name in SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
