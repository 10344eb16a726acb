"""Megatron-Core 0.16 / 0.17: our matrix optimizer assembled into Megatron's layer-wise distributed optimizer.

These releases have no emerging-optimizer registry: `get_megatron_muon_optimizer` constructs its TensorParallelMuon
inline. `build_layer_wise` assembles the same pieces that function assembles (Megatron's param groups and Adam,
`LayerWiseDistributedOptimizer`) around our optimizer's engine class instead (`nemo_muon.megatron.shared.engine`),
with ownership by update cost (`cost_balanced`). By default gradients and parameters travel as Megatron's own wiring
sends them (DDP's all-reduce, the end-of-step all-gather); with ``optimizer.collectives=reduce_scatter`` (opt-in)
gradients are reduced to their owners (`owner_reduce`) and parameters gathered in the next forward (`owner_gather`).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from nemo_muon.config.optimizer import MEGATRON_COLLECTIVES, BaseOptimizerConfig
from nemo_muon.megatron.core_016_017.cost_balanced import ns_balanced_class
from nemo_muon.megatron.core_016_017.owner_gather import gather_in_forward
from nemo_muon.megatron.core_016_017.owner_reduce import reduce_to_owners
from nemo_muon.megatron.shared.engine import (
    engine_class_of,
    engine_kwargs,
    finish_wrapping,
    init_placeholder_state,
    nonfinite_policy,
)
from nemo_muon.megatron.shared.nonfinite import apply_nonfinite_policy
from nemo_muon.registry import spec_for

COLLECTIVES = MEGATRON_COLLECTIVES
"""How gradients and parameters travel (`build_layer_wise`): Megatron's legacy all-reduce and end-of-step
all-gather, or reduced to their owners and gathered in the next forward (the recipe's ``optimizer.collectives``)."""
OWNERSHIPS = ("ns_cost", "megatron")
"""Who owns which matrix (`build_layer_wise`): LPT on the update cost, or Megatron's own numel ping-pong."""


def build_layer_wise(config: Any, model_chunks: list[Any], pg_collection: Any, config_overrides: Any = None, *,
                         ours: BaseOptimizerConfig, ownership: str = "ns_cost",
                         collectives: str = "all_reduce") -> Any:
    """Megatron-Core 0.16 / 0.17: our Muon for the 2-D non-embedding weights, Megatron's Adam for the rest, both inside
    Megatron's `LayerWiseDistributedOptimizer` (the assembly `get_megatron_muon_optimizer` does, with our class).
    ``config_overrides``: Megatron's per-parameter overrides (Bridge's weight-decay rules), applied to both parts.
    ``ours``: the recipe's validated optimizer config; its registry entry names the class, its fields are the
    keyword arguments (`engine_kwargs`). ``ownership``: 'ns_cost' (LPT on the update cost,
    `nemo_muon.megatron.core_016_017.cost_balanced`) or 'megatron' (Megatron's numel ping-pong, for comparison).
    ``collectives``: 'reduce_scatter' (gradients reduced to their owners, `owner_reduce`; parameters all-gathered in
    the next forward, `owner_gather`) or 'all_reduce' (Megatron's legacy wiring: DDP all-reduces, the step
    all-gathers); the DDP chunks must not use the distributed optimizer (no layout exists before 0.18)."""
    from megatron.core.optimizer import _get_param_groups, get_megatron_optimizer
    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer

    if config.use_distributed_optimizer or config.fp16:
        raise ValueError("the layer-wise optimizer needs use_distributed_optimizer=False and fp16=False; got "
                         f"use_distributed_optimizer={config.use_distributed_optimizer}, fp16={config.fp16}")
    if collectives not in COLLECTIVES:
        raise ValueError(f"collectives must be one of {COLLECTIVES}; got {collectives!r}")
    matrices, others = [], []
    for chunk in model_chunks:
        for _, p in chunk.named_parameters():
            if not p.requires_grad:
                continue
            is_matrix = p.dim() == 2 and not getattr(p, "is_embedding_or_output_parameter", False)
            (matrices if is_matrix else others).append(p)
    adam_config = copy.copy(config)
    adam_config.optimizer, adam_config.bf16 = "adam", False  # the layer-wise wrapper adds the bf16 master weights
    try:  # Megatron's param groups and Adam see only the trainable params: split by requires_grad, then restore
        for p in others:
            p.requires_grad_(False)
        groups = _get_param_groups(model_chunks, adam_config, config_overrides)
        matrix_opt = engine_class_of(spec_for(ours))(groups, **engine_kwargs(ours, config, model_chunks,
                                                                               pg_collection))
        for p in others:
            p.requires_grad_(True)
        for p in matrices:
            p.requires_grad_(False)
        adam = get_megatron_optimizer(adam_config, model_chunks, config_overrides=config_overrides,
                                      use_gloo_process_groups=False)
    finally:
        for p in (*matrices, *others):
            p.requires_grad_(True)
    optimizers = [matrix_opt, *adam.chained_optimizers]
    init_fns = [init_placeholder_state] + [_init_adam_state] * len(adam.chained_optimizers)
    if ownership not in OWNERSHIPS:
        raise ValueError(f"ownership must be one of {OWNERSHIPS}; got {ownership!r}")
    target = getattr(ours, "ns_split_target", None)
    if ownership == "ns_cost":
        layer_wise = ns_balanced_class()(optimizers, config, pg_collection, init_state_fn_list=init_fns,
                                         split_target=target)
    elif target is not None:
        raise ValueError(f"ns_split_target needs ownership='ns_cost' (the split is planned with it); got "
                         f"ownership={ownership!r}, ns_split_target={target!r}")
    else:
        layer_wise = LayerWiseDistributedOptimizer(optimizers, config, pg_collection, init_state_fn_list=init_fns)
    finish_wrapping(layer_wise)
    apply_nonfinite_policy(layer_wise, nonfinite_policy(ours))
    if collectives == "reduce_scatter":
        _reduce_to_owners_and_gather(layer_wise, model_chunks, pg_collection)
    return layer_wise


def _reduce_to_owners_and_gather(layer_wise: Any, model_chunks: list[Any], pg_collection: Any) -> None:
    """Gradients reduced to their owners and parameters gathered in the next forward, on DDP-wrapped chunks
    without the distributed optimizer (`owner_reduce`, `owner_gather`); nothing at data-parallel size 1."""
    if layer_wise.dp_cp_params_list is None:
        return
    for chunk in model_chunks:
        ddp_config = getattr(chunk, "ddp_config", None)
        if ddp_config is None or not hasattr(chunk, "bucket_groups"):
            raise TypeError(f"collectives='reduce_scatter' needs DDP-wrapped model chunks; got {type(chunk).__name__}")
        if ddp_config.use_distributed_optimizer:
            raise ValueError("the layer-wise optimizer on Megatron-Core 0.16 / 0.17 needs DDP with "
                             "use_distributed_optimizer=False; got True")
    reduce_to_owners(layer_wise, model_chunks, pg_collection)
    gather_in_forward(layer_wise, model_chunks, pg_collection)


def _init_adam_state(opt: torch.optim.Optimizer, config: Any = None) -> None:
    """torch Adam's state before a checkpoint load (what Megatron-Core 0.16's Muon path does for its Adam part)."""
    for group in opt.param_groups:
        for p in group["params"]:
            if len(opt.state[p]) == 0:
                opt.state[p]["exp_avg"] = torch.zeros_like(p.data)
                opt.state[p]["exp_avg_sq"] = torch.zeros_like(p.data)


def build_engine(opt: BaseOptimizerConfig, config: Any, model_chunks: list[Any], pg_collection: Any, *,
                 config_overrides: Any = None) -> Any:
    """This generation's engine 'nemo_muon' (`nemo_muon.megatron.generations`): `build_layer_wise` with the
    recipe's ``optimizer.collectives``."""
    return build_layer_wise(config, model_chunks, pg_collection, config_overrides, ours=opt,
                            collectives=opt.collectives)
