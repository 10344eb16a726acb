"""What a Megatron optimizer holds for each parameter, read for comparison, and its checkpoint save and resume.

`masters` / `matrix_masters`: the fp32 master weights this rank's optimizer updates, by model parameter name;
`state_tensors`: every weight, master and optimizer-state tensor; `bits` compares tensors bit for bit (NaN
placeholders included); `checkpoint_state` / `resume_from`: Megatron's `dist_checkpointing` as megatron.training
saves and loads (``fully_reshardable`` distributed-optimizer state; integrity verified where Megatron-Core has it);
`settle` finishes the parameter gathers a Megatron-Core 0.16 / 0.17 step leaves to the next forward.
"""

from __future__ import annotations

from typing import Any


def matrix_masters(optimizer: Any, names: dict[int, str]) -> dict[str, tuple]:
    """Model parameter name -> (fp32 master weight, the torch optimizer that updates it) for the bf16 parameters of
    the layer-wise optimizer's matrix optimizer (Megatron's TensorParallelMuon, our MegatronMuon or MegatronSOAP) on
    this rank."""
    out = {}
    if hasattr(optimizer, "chained_optimizers"):
        for sub in optimizer.chained_optimizers:
            out.update(matrix_masters(sub, names))
        return out
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and any(k in type(inner).__name__ for k in ("Muon", "SOAP")):
        for model_group, master_group in zip(optimizer.float16_groups, optimizer.fp32_from_float16_groups,
                                             strict=True):
            for model_p, master in zip(model_group, master_group, strict=True):
                out[names[id(model_p)]] = (master, inner)
    return out


def masters(optimizer: Any, names: dict[int, str]) -> dict[str, Any]:
    """Model parameter name -> fp32 master weight (numpy) of every parameter this rank's Megatron optimizer updates
    (the bf16 parameters' fp32 copies and the fp32 parameters themselves; under the layer-wise optimizer: the ones
    this DP rank owns)."""
    out = {}
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        if sub is not optimizer and hasattr(sub, "chained_optimizers"):
            out.update(masters(sub, names))
            continue
        for model_group, master_group in zip(getattr(sub, "float16_groups", []),
                                             getattr(sub, "fp32_from_float16_groups", []), strict=True):
            for model_p, master in zip(model_group, master_group, strict=True):
                out[names[id(model_p)]] = master.detach().float().cpu().numpy().copy()
        for group in getattr(sub, "fp32_from_fp32_groups", []):
            for p in group:
                out[names[id(p)]] = p.detach().float().cpu().numpy().copy()
    return out



CHECKPOINT_METADATA = {"distrib_optim_sharding_type": "fully_reshardable"}
"""What megatron.training passes for torch_dist checkpoints: distributed-optimizer state in model space."""


def checkpoint_state(ddp_model: Any, optimizer: Any, *, loading: bool) -> dict:
    """The sharded state dict of the model and the optimizer (``loading``: for a load). The metadata is a new copy of
    `CHECKPOINT_METADATA` per call: Megatron-Core (0.19: ``ensure_metadata_has_dp_cp_group``) stores the current
    data-parallel group in it, and a shared dict would hand a later model-parallel state (another PP size) the
    groups of the first, whose replica ids then name two main replicas of each dense weight."""
    metadata = dict(CHECKPOINT_METADATA)
    model_sd = ddp_model.module.sharded_state_dict(metadata=metadata)
    return {"model": model_sd, "optimizer": optimizer.sharded_state_dict(model_sd, is_loading=loading,
                                                                         metadata=metadata)}


def settle(ddp_model: Any) -> None:
    """Finish the parameter gathers a step leaves to the next forward, before reading the parameters outside a forward:
    ours on Megatron-Core 0.16 / 0.17 (`nemo_muon.megatron.core_016_017.owner_gather`), DDP's own where its config
    overlaps the param gather with the forward (Bridge's setup on a layout)."""
    gathers = getattr(ddp_model, "param_gathers", None)
    if gathers is not None:
        gathers.finish()
    if getattr(ddp_model.ddp_config, "overlap_param_gather", False):
        ddp_model.start_param_sync(force_sync=True)


def resume_from(ddp_model: Any, optimizer: Any, checkpoint_dir: str, state_for_load: dict | None = None) -> None:
    """Megatron's `dist_checkpointing.load` of ``checkpoint_dir`` into the model and the optimizer, as
    megatron.training resumes (``state_for_load``: the sharded state dict, when the caller built it already)."""
    from megatron.core import dist_checkpointing

    if state_for_load is None:
        state_for_load = checkpoint_state(ddp_model, optimizer, loading=True)
    loaded = dist_checkpointing.load(state_for_load, checkpoint_dir, **integrity_check())
    ddp_model.module.load_state_dict(loaded["model"])
    optimizer.load_state_dict(loaded["optimizer"])


def integrity_check() -> dict[str, bool]:
    """``verify_integrity=True`` where `dist_checkpointing.save` / ``load`` have it (Megatron-Core 0.19: a SHA-256
    manifest written on save and checked before anything is read on load); nothing on 0.16, which has none."""
    import inspect

    from megatron.core import dist_checkpointing

    return {"verify_integrity": True} if "verify_integrity" in inspect.signature(dist_checkpointing.load).parameters \
        else {}



def state_tensors(ddp_model: Any, optimizer: Any, names: dict[int, str]) -> dict[str, Any]:
    """Copies of every model weight, fp32 master and optimizer-state tensor, by a readable label."""
    import torch

    settle(ddp_model)
    tensors = {f"weight {n}": p.detach().clone() for n, p in ddp_model.module.named_parameters()}
    tensors |= {f"master {n}": torch.from_numpy(m) for n, m in masters(optimizer, names).items()}
    for i, sub in enumerate(getattr(optimizer, "chained_optimizers", [optimizer])):
        for group in sub.optimizer.param_groups:
            for j, p in enumerate(group["params"]):
                for k, v in sub.optimizer.state.get(p, {}).items():
                    if isinstance(v, torch.Tensor):
                        tensors[f"state {i}.{j}.{k}"] = v.detach().clone()
    return tensors


def bits(tensor: Any) -> Any:
    """The tensor's bytes (so that equal NaN placeholders compare equal)."""
    import torch

    return tensor.detach().contiguous().reshape(-1).view(torch.uint8) if tensor.numel() else tensor
