"""The single-process reference of a preflight: the first optimizer step of the whole tiny model in one process.

From the replicas' initial weights, one process runs the tiny model (no DDP, no distributed optimizer) forward and
backward on every data-parallel rank's batch of the first step, averages the gradients as data parallelism does
(each rank's bf16 gradient scaled by 1 / DP, summed in bf16), clips them by their total norm as the trainer does,
and applies the recipe's optimizer as the PyTorch drop-in (`nemo_muon.optim.factory.build_optimizer`) to the fp32
masters of the matrices. The distributed run's masters after its first step must match it (`checks`): gradients
reduced to the wrong owner, a clip coefficient taken from one rank's share of the norm, or an update applied twice
or not at all move a matrix by a whole update.

It runs after the distributed runs, in a model-parallel state of its own at expert parallelism 1 (`run_first_step`),
on rank 0, from the replicas' initial weights gathered there (`whole_model_state`: at EP > 1 each expert-parallel
rank holds its own experts, ``local_experts.i`` of EP rank r being expert ``r * local + i`` of the whole model). Where
the math allows it: our engine's update (``engine='nemo_muon'``: the drop-in is the same optimizer); `not_run_reason`
says why it does not run otherwise.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

CLIP_EPS = 1.0e-6
"""Added to the total norm before the clip coefficient, as Megatron-Core's ``clip_grad_by_total_norm_fp32``."""


EXPERT_INDEX = re.compile(r"\.local_experts\.(\d+)\.", re.ASCII)
"""Where a parameter name of Megatron's ``SequentialMLP`` holds its local expert index."""
EP_KEY = re.compile(r"^ep(\d+)/", re.ASCII)
"""The world-wide key of an expert parameter starts with its expert-parallel rank (`nemo_muon.preflight.world.world_key`)."""


def not_run_reason(recipe: Any) -> str | None:
    """Why the single-process reference cannot run for ``recipe``; None when it can."""
    engine = getattr(recipe.optimizer, "engine", "nemo_muon")
    if engine != "nemo_muon":
        return f"optimizer.engine={engine!r}: the drop-in is nemo-muon's optimizer, not Megatron-Core's"
    return None


def whole_model_name(name: str, ep_rank: int, local_experts: int) -> str:
    """The name in the EP=1 model of EP rank ``ep_rank``'s parameter or state entry ``name`` (an expert's index is
    ``ep_rank * local_experts + i``; other names are the same)."""
    m = EXPERT_INDEX.search(name)
    if m is None:
        return name
    return f"{name[:m.start(1)]}{ep_rank * local_experts + int(m.group(1))}{name[m.end(1):]}"


def world_key_to_name(key: str, local_experts: int) -> str:
    """A world-wide key (``ep<r>/<name>`` for an expert, else the name) -> the name in the EP=1 model."""
    m = EP_KEY.match(key)
    if m is None:
        return key
    if EXPERT_INDEX.search(key) is None:  # another expert layout (grouped GEMM weights): the mapping would be wrong
        raise ValueError(f"expert parameter {key!r} has no '.local_experts.<i>.' in its name: the single-process "
                         "reference maps Megatron's SequentialMLP experts only (moe_grouped_gemm=False)")
    return whole_model_name(key[m.end():], int(m.group(1)), local_experts)


def whole_model_state(module: Any, ep_rank: int, local_experts: int, contributes: bool) -> dict[str, Any] | None:
    """Rank 0: the whole tiny model's state dict (CPU copies, the names of the model at EP = PP = 1) from ``module`` on
    the ranks that ``contributes`` (one replica per expert-parallel rank and pipeline stage: expert data-parallel
    rank 0); None on the other ranks.
    Collective over the default group."""
    import torch.distributed as dist

    from nemo_muon.preflight.replica import pipeline_names

    state = None
    if contributes:  # copies: the training steps change the weights next
        whole = pipeline_names(module)
        state = {whole_model_name(whole(k), ep_rank, local_experts): v.detach().to("cpu", copy=True)
                 if hasattr(v, "detach") else v for k, v in module.state_dict().items()}
    gathered: list[Any] | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(state, gathered, dst=0)
    if gathered is None:
        return None
    whole: dict[str, Any] = {}
    for part in gathered:
        whole.update(part or {})
    return whole


@dataclasses.dataclass
class FirstStep:
    """What the single-process comparison needs from the distributed runs (world-wide keys, fp32 numpy masters)."""

    state: dict[str, Any] | None
    """Rank 0: `whole_model_state` of the replicas before any step; None elsewhere."""
    matrices: set[str]
    """The world-wide keys of the matrices the matrix optimizer updates."""
    ours: dict[str, Any]
    reference: dict[str, Any]
    initial: dict[str, Any]
    """Every parameter's master after the first step (ours, the reference path) and before it."""
    dp_size: int
    local_experts: int
    micro_batches: int = 1
    """Micro-batches of each data-parallel rank's step."""


def first_step_gradients(model: Any, dp_size: int, vocab: int, micro_batches: int = 1) -> dict[str, Any]:
    """Parameter name -> the first step's gradient (bf16) averaged over ``dp_size`` data-parallel ranks' batches, each
    rank's ``micro_batches`` through Megatron's schedule as that rank's (the aux losses scaled as the schedule
    scales them)."""
    from nemo_muon.preflight.batches import batch, through_schedule

    device = next(model.parameters()).device
    total: dict[str, Any] = {}
    for dp_rank in range(dp_size):
        model.zero_grad(set_to_none=True)
        through_schedule([model], [tuple(t.to(device) for t in batch(0, dp_rank * micro_batches + i, vocab))
                                   for i in range(micro_batches)])
        for name, p in model.named_parameters():
            if p.grad is None:
                continue
            share = (p.grad * (1.0 / dp_size)).to(p.dtype)
            total[name] = share if name not in total else total[name] + share
    model.zero_grad(set_to_none=True)
    return total


def clip_coefficient(grads: dict[str, Any], max_norm: float) -> float:
    """The factor the trainer multiplies every gradient by: ``max_norm / (total norm + CLIP_EPS)`` when below 1."""
    import torch

    norm = float(torch.sqrt(sum(g.float().pow(2).sum() for g in grads.values())))
    coefficient = max_norm / (norm + CLIP_EPS) if max_norm > 0 else 1.0
    return min(coefficient, 1.0)


def single_process_masters(initial_state: dict[str, Any], recipe: Any, dp_size: int, matrices: set[str],
                           device: Any, micro_batches: int = 1) -> dict[str, Any]:
    """Name -> fp32 master (numpy) of each of ``matrices`` (EP=1 names) after the first step of the single-process
    reference (module doc) on ``device``, from ``initial_state`` (the whole model's state dict before any step).
    Needs Megatron's model-parallel state at expert parallelism 1."""
    import torch

    from nemo_muon.megatron.shared.engine import fused_layouts
    from nemo_muon.optim.factory import build_optimizer
    from nemo_muon.optim.routing import MATRIX
    from nemo_muon.preflight.tiny_model import build_tiny_model, tiny_spec_of_family
    from nemo_muon.registry import spec_for

    model, config, spec = build_tiny_model(tiny_spec_of_family(recipe.model.family))
    model = model.to(device)
    model.load_state_dict(initial_state)
    grads = first_step_gradients(model, dp_size, spec.vocab_size, micro_batches)
    factor = clip_coefficient(grads, recipe.trainer.grad_clip)
    params = dict(model.named_parameters())
    names = sorted(matrices)
    masters = [params[n].detach().float().clone() for n in names]
    for name, master in zip(names, masters, strict=True):
        master.grad = grads[name].float() * factor
    runtime: dict[str, Any] = {}
    if "fused_layouts" in spec_for(recipe.optimizer).runtime_args:
        runtime["fused_layouts"] = fused_layouts(config, 1, names)
    group = {"params": masters, "param_names": names, "algorithm": MATRIX}
    build_optimizer(recipe.optimizer, [group], **runtime).step()
    del model
    with torch.no_grad():
        return {n: m.detach().cpu().numpy().copy() for n, m in zip(names, masters, strict=True)}


def run_first_step(first: FirstStep, recipe: Any, device: Any) -> dict[str, Any]:
    """World-wide key -> fp32 master (numpy) of each of ``first.matrices`` after the single-process reference's first
    step, on every rank of the default group: rank 0 computes it inside a model-parallel state of its own at EP=1
    (module doc) and broadcasts it. Call it outside any other model-parallel state; collective."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    names = {world_key_to_name(k, first.local_experts): k for k in first.matrices}
    parallel_state.initialize_model_parallel()  # EP=1: the whole tiny model in one process
    try:
        holder: list[Any] = [None]
        if dist.get_rank() == 0:
            by_name = single_process_masters(first.state, recipe, first.dp_size, set(names), device,
                                             first.micro_batches)
            holder[0] = {names[n]: m for n, m in by_name.items()}
        dist.broadcast_object_list(holder, src=0)
    finally:
        parallel_state.destroy_model_parallel()
    return holder[0]
