"""One replica of a preflight's tiny model on this rank: built from the fixed seed with its DDP wrap and its Megatron
optimizer (nemo-muon's builder on Megatron-Core, or Megatron-Bridge's own setup), and one training step of it."""

from __future__ import annotations

import dataclasses
import time
from typing import Any


@dataclasses.dataclass
class Replica:
    """One replica: the DDP-wrapped tiny model, the Megatron optimizer built for it, and what they are."""

    role: str
    opt: Any
    layout: str
    ddp_model: Any
    optimizer: Any
    vocab: int

    @property
    def names(self) -> dict[int, str]:
        """id(param) -> parameter name."""
        return {id(p): n for n, p in self.ddp_model.module.named_parameters()}


def rank_device() -> Any:
    """This rank's CUDA device, or the CPU where there is none (the test harness's ranks)."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build_replica(role: str, opt: Any, layout: str, recipe: Any, ep: int, setup: str = "megatron-core",
                  steps: int = 1) -> Replica:
    """A replica from the fixed seed on this rank's device, its DDP wrap and the optimizer of ``opt``: by nemo-muon's
    builder on Megatron-Core, or (``setup='bridge'``, ``opt`` the recipe's) by Megatron-Bridge's own setup
    (`nemo_muon.preflight.bridge_setup`, a constant learning rate over ``steps``)."""
    import torch
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

    from nemo_muon.megatron.shared.build import build_megatron_optimizer, mpu_process_groups
    from nemo_muon.preflight.batches import SEED
    from nemo_muon.preflight.tiny_model import build_tiny_model, tiny_spec_of_family
    from nemo_muon.preflight.wiring import has_layouts, wrap_in_ddp

    model_parallel_cuda_manual_seed(SEED, inference_rng_tracker=True)
    torch.manual_seed(SEED)
    bridge = setup == "bridge"
    model, config, spec = build_tiny_model(tiny_spec_of_family(recipe.model.family), ep=ep,
                                           mixed_precision_wrap=not bridge)
    model = model.to(rank_device())
    pgs = mpu_process_groups()
    if bridge:
        from nemo_muon.preflight.bridge_setup import build_through_bridge

        ddp_model, optimizer = build_through_bridge(recipe, model, pgs, steps)
        config.finalize_model_grads_func = finalize_model_grads
        config.no_sync_func = ddp_model.no_sync
        return Replica(role, opt, layout, ddp_model, optimizer, spec.vocab_size)
    ddp_model = wrap_in_ddp(model, config, opt, True, pgs, layout=layout)
    if getattr(opt, "engine", None) == "nemo_muon" and has_layouts():  # on >= 0.18 DDP's wiring decides
        wired = "reduce_scatter" if ddp_model.ddp_config.use_distributed_optimizer else "all_reduce"
        opt = dataclasses.replace(opt, collectives=wired)
    ddp_model.broadcast_params()
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = ddp_model.no_sync
    optimizer, _ = build_megatron_optimizer(opt, [ddp_model], grad_clip=recipe.trainer.grad_clip, pg_collection=pgs)
    return Replica(role, opt, layout, ddp_model, optimizer, spec.vocab_size)


def train_step(replica: Replica, step: int, dp_rank: int, dp_size: int) -> tuple[float, float, bool]:
    """(loss averaged over the data-parallel ranks, optimizer-step seconds of the slowest rank, applied) of one step."""
    import torch
    import torch.distributed as dist

    from nemo_muon.preflight.batches import forward_backward

    loss = forward_backward(replica.ddp_model, replica.optimizer, step, dp_rank, replica.vocab)
    _sync()
    start = time.perf_counter()
    ok, _, _ = replica.optimizer.step()
    _sync()
    elapsed = time.perf_counter() - start
    figures = torch.tensor([float(loss), elapsed], dtype=torch.float64, device=rank_device())
    peak = figures[1:].clone()
    dist.all_reduce(figures[:1])
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    return float(figures[0]) / dp_size, float(peak[0]), bool(ok)
