"""The single-process reference of a preflight: the first optimizer step of the whole tiny model in one process.

From the replicas' initial weights, one process runs the tiny model (no DDP, no distributed optimizer) forward and
backward on every data-parallel rank's batch of the first step, averages the gradients as data parallelism does
(each rank's bf16 gradient scaled by 1 / DP, summed in bf16), clips them by their total norm as the trainer does,
and applies the recipe's optimizer as the PyTorch drop-in (`nemo_muon.optim.factory.build_optimizer`) to the fp32
masters of the matrices. The distributed run's masters after its first step must match it (`checks`): gradients
reduced to the wrong owner, a clip coefficient taken from one rank's share of the norm, or an update applied twice
or not at all move a matrix by a whole update.

Where the math allows it: the whole model in one process (expert parallelism 1: the experts of EP > 1 live on
several ranks) and our engine's update (``engine='nemo_muon'``: the drop-in is the same optimizer); `not_run_reason`
says why it does not run otherwise.
"""

from __future__ import annotations

from typing import Any

CLIP_EPS = 1.0e-6
"""Added to the total norm before the clip coefficient, as Megatron-Core's ``clip_grad_by_total_norm_fp32``."""


def not_run_reason(recipe: Any, ep: int) -> str | None:
    """Why the single-process reference cannot run for ``recipe`` at expert parallelism ``ep``; None when it can."""
    engine = getattr(recipe.optimizer, "engine", "nemo_muon")
    if engine != "nemo_muon":
        return f"optimizer.engine={engine!r}: the drop-in is nemo-muon's optimizer, not Megatron-Core's"
    if ep != 1:
        return f"ep={ep}: the experts live on {ep} ranks; one process holds them only at ep=1"
    return None


def first_step_gradients(model: Any, dp_size: int, vocab: int) -> dict[str, Any]:
    """Parameter name -> the first step's gradient (bf16) averaged over ``dp_size`` data-parallel batches, each
    batch through Megatron's schedule as one rank's (the aux losses scaled as the schedule scales them)."""
    from nemo_muon.preflight.batches import batch, through_schedule

    device = next(model.parameters()).device
    total: dict[str, Any] = {}
    for dp_rank in range(dp_size):
        model.zero_grad(set_to_none=True)
        through_schedule([model], [tuple(t.to(device) for t in batch(0, dp_rank, vocab))])
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


def single_process_masters(initial_state: dict[str, Any], recipe: Any, dp_size: int,
                           matrices: set[str]) -> dict[str, Any]:
    """Name -> fp32 master (numpy) of each of ``matrices`` after the first step of the single-process reference
    (module doc), from ``initial_state`` (the replicas' model state dict before any step)."""
    import torch

    from nemo_muon.megatron.shared.engine import fused_layouts
    from nemo_muon.optim.factory import build_optimizer
    from nemo_muon.optim.routing import MATRIX
    from nemo_muon.preflight.tiny_model import build_tiny_model, tiny_spec_of_family
    from nemo_muon.registry import spec_for

    model, config, spec = build_tiny_model(tiny_spec_of_family(recipe.model.family))
    model.load_state_dict(initial_state)
    device = next(iter(initial_state.values())).device
    model = model.to(device)
    grads = first_step_gradients(model, dp_size, spec.vocab_size)
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
