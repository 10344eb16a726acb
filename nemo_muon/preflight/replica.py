"""One replica of a preflight's tiny model on this rank: built from the fixed seed with its DDP wrap and its Megatron
optimizer (nemo-muon's builder on Megatron-Core, or Megatron-Bridge's own setup), and one training step of it.

A replica knows its parameters by their names in the whole model (`pipeline_names`): on a pipeline stage after the
first, Megatron numbers the stage's decoder layers from 0, and the same name would mean another layer on each stage.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from collections.abc import Callable
from typing import Any

DECODER_LAYER = re.compile(r"(^|\.)decoder\.layers\.(\d+)\.", re.ASCII)
"""Where a parameter (or state-dict) name of Megatron's `TransformerBlock` holds the stage-local layer index."""


def pipeline_names(module: Any) -> Callable[[str], str]:
    """Stage-local name -> the name in the whole model (``decoder.layers.<i>.``: the layer's global index, Megatron's
    ``layer_number - 1``) for the names of ``module`` and of its state dict; the identity without pipeline
    parallelism."""
    offsets: dict[int, int] = {}
    for name, sub in module.named_modules():
        if name.split(".")[-1] == "decoder" and hasattr(sub, "layers"):
            offsets = {i: layer.layer_number - 1 for i, layer in enumerate(sub.layers)}

    def whole(name: str) -> str:
        m = DECODER_LAYER.search(name)
        if m is None or int(m.group(2)) not in offsets:
            return name
        return f"{name[:m.start(2)]}{offsets[int(m.group(2))]}{name[m.end(2):]}"

    return whole


@dataclasses.dataclass
class Replica:
    """One replica: the DDP-wrapped tiny model, the Megatron optimizer built for it, and what they are."""

    role: str
    opt: Any
    layout: str
    ddp_model: Any
    optimizer: Any
    vocab: int
    micro_batches: int = 1
    """Micro-batches of each step on this rank (`micro_batches_per_rank`)."""

    @functools.cached_property
    def params(self) -> dict[str, Any]:
        """The parameter of each name in the whole model (`pipeline_names`) this rank holds (read once: the model's
        parameters are fixed when it is built)."""
        whole = pipeline_names(self.ddp_model.module)
        return {whole(n): p for n, p in self.ddp_model.module.named_parameters()}

    @functools.cached_property
    def names(self) -> dict[int, str]:
        """id(param) -> the parameter's name in the whole model (`pipeline_names`)."""
        return {id(p): n for n, p in self.params.items()}


def micro_batches_per_rank(pp: int) -> int:
    """Micro-batches of a step on each rank at pipeline size ``pp``: a step's global batch is one micro-batch per rank
    of the world whatever the layout (each of a stage's W / pp data-parallel ranks runs pp), so a resume at another
    pipeline size, and so at another data-parallel size, steps on the same batch; and every pipeline runs as many
    micro-batches as it has stages."""
    return pp


def rank_device() -> Any:
    """This rank's CUDA device, or the CPU where there is none (the test harness's ranks)."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def build_replica(role: str, opt: Any, layout: str, recipe: Any, ep: int, setup: str = "megatron-core",
                  steps: int = 1, pp: int = 1) -> Replica:
    """A replica from the fixed seed on this rank's device, its DDP wrap and the optimizer of ``opt``: by nemo-muon's
    builder on Megatron-Core, or (``setup='bridge'``, ``opt`` the recipe's) by Megatron-Bridge's own setup
    (`nemo_muon.preflight.bridge_setup`, a constant learning rate over ``steps``); this rank's pipeline stage of
    ``pp`` (Megatron's parallel state must be initialized with ``ep`` and ``pp``)."""
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
    model, config, spec = build_tiny_model(tiny_spec_of_family(recipe.model.family), ep=ep, pp=pp,
                                           mixed_precision_wrap=not bridge)
    model = model.to(rank_device())
    pgs = mpu_process_groups()
    if bridge:
        from nemo_muon.preflight.bridge_setup import build_through_bridge

        ddp_model, optimizer = build_through_bridge(recipe, model, pgs, steps)
        config.finalize_model_grads_func = finalize_model_grads
        config.no_sync_func = ddp_model.no_sync
        return Replica(role, opt, layout, ddp_model, optimizer, spec.vocab_size, micro_batches_per_rank(pp))
    ddp_model = wrap_in_ddp(model, config, opt, True, pgs, layout=layout)
    if getattr(opt, "engine", None) == "nemo_muon" and has_layouts():  # on >= 0.18 DDP's wiring decides
        wired = "reduce_scatter" if ddp_model.ddp_config.use_distributed_optimizer else "all_reduce"
        opt = dataclasses.replace(opt, collectives=wired)
    ddp_model.broadcast_params()
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = ddp_model.no_sync
    optimizer, _ = build_megatron_optimizer(opt, [ddp_model], grad_clip=recipe.trainer.grad_clip, pg_collection=pgs)
    return Replica(role, opt, layout, ddp_model, optimizer, spec.vocab_size, micro_batches_per_rank(pp))


def train_step(replica: Replica, step: int, dp_rank: int, dp_size: int) -> tuple[float, float, bool]:
    """(loss averaged over the data-parallel ranks, optimizer-step seconds of the slowest rank, applied) of one step."""
    import torch
    import torch.distributed as dist

    from nemo_muon.preflight.batches import forward_backward

    loss = forward_backward(replica.ddp_model, replica.optimizer, step, dp_rank, replica.vocab, replica.micro_batches)
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
