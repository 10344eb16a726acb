"""FLOPs of one training step of a recipe, from `nemo_muon.accounting` (model FLOPs and Newton–Schulz FLOPs).

Model FLOPs follow Megatron's convention (`accounting.model_flops`); NS FLOPs are Muon's useful orthogonalization
work (`accounting.ns_count.ns_flops`, every hidden matrix once, split as the optimizer splits fused gate/up and QKV).
Optimizers whose registry entry runs no Newton–Schulz (AdamW, SOAP: ``spec.matrix.newton_schulz``) have ns_flops = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_muon.accounting.model_flops import model_flops_per_step
from nemo_muon.accounting.ns_count import ns_flops
from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.models.matrices import matrix_params
from nemo_muon.registry import spec_for


@dataclass(frozen=True)
class StepFlops:
    model_flops: float
    """Forward + backward FLOPs of one optimizer step (whole global batch, all ranks together)."""
    ns_flops: float
    """Newton–Schulz FLOPs of one optimizer step (all matrices once)."""


def step_flops(recipe: TrainingRecipe, *, tokens_per_step: int, world_size: int) -> StepFlops:
    """Model and NS FLOPs of one step of ``recipe`` (``tokens_per_step`` = global batch x sequence length)."""
    seq = recipe.trainer.seq_length
    model = model_flops_per_step(recipe.model, seq, tokens_per_step // seq)
    ns = 0.0
    cfg, matrix = recipe.optimizer, spec_for(recipe.optimizer).matrix
    if matrix is not None and matrix.newton_schulz:
        params = matrix_params(recipe.model, **matrix.routing(cfg))
        ns = ns_flops(params, steps=cfg.ns_steps).useful
    return StepFlops(model_flops=model, ns_flops=ns)
