"""What the house needs to know of one optimizer: `OptimizerSpec` (torch-free data; see ``nemo_muon.registry``).

A spec names the parts that live in higher layers (the torch optimizer class, Megatron's field mapping) by
``"module:attribute"`` references, resolved by the layer that uses them (`resolve`), so the registry itself stays
importable on a login node without torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Shape = tuple[int, ...]
Hyperparameters = Mapping[str, Any]
"""A config's fields (``dataclasses.asdict``) or an optimizer's param group: the cost functions read keys."""


@dataclass(frozen=True, kw_only=True)
class MatrixSpec:
    """How a matrix optimizer (whole matrices per data-parallel rank) treats the hidden matrices."""

    routing: Callable[[Any], dict[str, bool]]
    """Config -> ``split_qkv`` / ``split_gate_up``: which fused weights its update splits into their parts."""
    update_flops: Callable[[Shape, Hyperparameters], float]
    """FLOPs per step of the update of one matrix (of one part, when ``per_part``): the ownership cost."""
    per_part: bool
    """The update runs on each fused part separately (Muon's NS) or on the fused matrix whole (SOAP)."""
    state_elements: Callable[[Shape], int]
    """fp32 state elements one owned matrix holds besides its fp32 master (momentum, factors, ...)."""
    newton_schulz: bool
    """The update is Newton–Schulz: its FLOPs are the ones the MFU accounting counts (``ns_flops``)."""
    splittable: bool
    """Split ownership (``ns_split_target``: one matrix's NS over a block of DP ranks) applies."""
    element_bytes: int = 22
    """HBM bytes per matrix element of the update's element-wise passes besides its matmuls (state read and written,
    master, the bf16 parameter written): what the step-time model (`nemo_muon.accounting.step_time`) prices them at.
    The default is Muon's: grad and momentum read, momentum written (12 B), master read and written (8 B), bf16 param
    written (2 B)."""

    def update_cost(self, shape: Shape, parts: Sequence[Shape], hyperparameters: Hyperparameters) -> float:
        """FLOPs per step of one parameter's update: the sum over the fused ``parts`` it is split into, or of the
        whole ``shape`` when the update runs on the fused matrix (``per_part``)."""
        if not self.per_part:
            return self.update_flops(shape, hyperparameters)
        return sum(self.update_flops(part, hyperparameters) for part in parts)


@dataclass(frozen=True, kw_only=True)
class MegatronSpec:
    """How the optimizer runs on the megatron backend."""

    engines: tuple[str, ...]
    """The ``optimizer.engine`` values it accepts: 'nemo_muon' (ours inside Megatron's layer-wise optimizer),
    'megatron' (Megatron-Core's own implementation); () for an element-wise optimizer (Megatron's distributed one)."""
    bridge_name: str
    """Megatron's / Bridge's optimizer name for its family ('muon', 'soap', 'adam'): what Bridge's setup and
    Megatron's DDP defaults key on."""
    registered_name: str | None = None
    """Engine 'nemo_muon' on Megatron-Core >= 0.18: the name ours is registered under in Megatron's emerging-optimizer
    registry (``OptimizerConfig.optimizer``)."""
    bridge_layer_wise_name: str | None = None
    """Megatron-Bridge >= 0.4's name of the family's layer-wise form where it differs from ``bridge_name``
    ('dist_muon'; Bridge's SOAP is 'soap' either way)."""
    fields: str | None = None
    """``"module:function"`` of the mapping ``(config, api, field_names, *, engine, ...) -> OptimizerConfig kwargs``
    (``nemo_muon.megatron.shared.optimizer_config``): the fields Megatron's config shows for either engine (engine
    'nemo_muon' never reads them back), and what engine 'megatron' runs."""
    adam_fields: tuple[str, str] = ("betas", "eps")
    """The config's fields of Megatron's Adam (betas, eps), which updates what the matrix optimizer does not (the
    NeMo 2 recipes' ``adam_beta1`` / ``adam_beta2`` / ``adam_eps`` set them)."""
    recipe_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Config values the megatron perf recipes set where our defaults are not what Megatron-Core can honour."""

    def adam_part(self, config: Any) -> tuple[tuple[float, float], float]:
        """(betas, eps) of Megatron's Adam in ``config`` (`adam_fields`)."""
        betas, eps = self.adam_fields
        return tuple(getattr(config, betas)), getattr(config, eps)

    def logged_names(self) -> tuple[str, ...]:
        """Megatron's / Bridge's names of the family (``bridge_name``, its layer-wise form, ``dist_<name>`` as
        Bridge 0.3 spells it) and our registered name: what a Megatron log's ``optimizer`` may say."""
        names = (self.registered_name, self.bridge_name, self.bridge_layer_wise_name, f"dist_{self.bridge_name}")
        return tuple(dict.fromkeys(n for n in names if n))


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    """One optimizer: its name, config class, implementation, cost and Megatron integration."""

    name: str
    """The name recipes, overrides (``optimizer=<name>``), documents and reports use; the config's ``name``."""
    label: str
    """Human name (``Muon``)."""
    config_class: type
    """The validated config dataclass; found by exact class (`nemo_muon.registry.spec_for`)."""
    implementation: str
    """``"module:Class"`` of the torch optimizer: ``Class(named_params, **config.optimizer_kwargs(), **runtime)``."""
    runtime_args: tuple[str, ...]
    """Keyword arguments the implementation takes besides the config's (``tp_group``, ``fused_layouts``, ...)."""
    matrix: MatrixSpec | None
    """None: an element-wise optimizer (state sharded by elements: Megatron's distributed optimizer)."""
    megatron: MegatronSpec
    baseline: str | None = None
    """The registered optimizer it is measured against (reports pair its runs with that one's, the demo and
    ``nemo-muon bench`` run it next); None: a baseline itself, or compared with none."""


def resolve(reference: str) -> Any:
    """The object a ``"module:attribute"`` reference names (imports the module)."""
    module, sep, attribute = reference.partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"an optimizer spec reference must have the form 'module:attribute'; got {reference!r}")
    return getattr(importlib.import_module(module), attribute)
