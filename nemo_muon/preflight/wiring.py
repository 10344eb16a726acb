"""How a tiny model is wrapped in Megatron-Core's DDP for one optimizer path: the wirings of the layer-wise optimizer.

On Megatron-Core >= 0.18 DDP decides the wiring from a parameter layout: Megatron's (``wrap_model_chunks_with_ddp``:
reduce-scatter + all-gather, ownership by numel), the legacy path (no layout: all-reduce, then the layer-wise
optimizer's uneven all-gather) or ours (`nemo_muon.megatron.core_018_plus.cost_layout`: reduce-scatter + all-gather,
ownership by update cost, what Megatron-Bridge 0.5 / 0.6 builds for ``collectives='reduce_scatter'``). 0.16 / 0.17
have no layout: plain DDP, and the optimizer's ``collectives`` decide (`nemo_muon.megatron.core_016_017`).
"""

from __future__ import annotations

from typing import Any

LAYOUTS = ("megatron", "legacy", "cost")
"""The DDP wirings `wrap_in_ddp` builds on Megatron-Core >= 0.18 (module doc)."""


def has_layouts() -> bool:
    """Megatron-Core >= 0.18: DDP decides the wiring from a parameter layout."""
    from nemo_muon.megatron.generations import installed_core_generation

    return installed_core_generation().parameter_layout


def ddp_config_kwargs(opt: Any) -> dict[str, Any]:
    """`DistributedDataParallelConfig` kwargs: the optimizer's flags
    (`nemo_muon.megatron.shared.optimizer_config.ddp_flags`), no overlap, bf16 reductions."""
    from nemo_muon.megatron.shared.optimizer_config import ddp_flags

    return {**ddp_flags(opt), "overlap_grad_reduce": False, "overlap_param_gather": False,
            "grad_reduce_in_fp32": False}


def wrap_in_ddp(model: Any, config: Any, opt: Any, layer_wise: bool, pg_collection: Any,
                grad_reduce_in_fp32: bool = False, layout: str = "megatron") -> Any:
    """``model`` wrapped in Megatron's `DistributedDataParallel` for optimizer ``opt``: one of `LAYOUTS` on >= 0.18
    (a cost-layout wrap carries its plan as ``cost_layout_plan``), plain DDP on 0.16 / 0.17."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}; got {layout!r}")
    ddp_config = DistributedDataParallelConfig(**{**ddp_config_kwargs(opt), "grad_reduce_in_fp32": grad_reduce_in_fp32})
    try:  # Megatron-Core >= 0.18 ships the wiring that computes the layer-wise param layout
        from megatron.training.training import wrap_model_chunks_with_ddp
    except ImportError:  # 0.16: the wheel has no megatron.training
        return DistributedDataParallel(config, ddp_config, model)
    if layer_wise and layout == "cost":
        from nemo_muon.megatron.generations import entry, installed_core_generation

        wrap_with_cost_layout = entry(installed_core_generation().wrap_with_cost_layout)
        (wrapped,), (plan,) = wrap_with_cost_layout([model], config, ddp_config, ours=opt,
                                                    pg_collection=pg_collection, bucket_size=ddp_config.bucket_size)
        wrapped.cost_layout_plan = plan  # the plan the layout encodes (preflight's owner check reads it)
        return wrapped
    return wrap_model_chunks_with_ddp([model], config, ddp_config, use_layer_wise_distributed_optimizer=layer_wise,
                                      use_layer_wise_param_layout=layout != "legacy")[0]
