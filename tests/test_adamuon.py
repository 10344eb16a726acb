"""AdaMuon (`nemo_muon.optim.adamuon`, registered in `nemo_muon.registry.adamuon`): its update against emerging-optimizers'
``AdaptiveMuon(moment2_method="adamuon")`` within a derived fp32 bound, the paper's RMS-aligned rescaling per fused part
and expert, the state a checkpoint loads into, and how the registry plans, checks and refuses it. Training on the
torch backend is in tests/test_train_loop.py (``optimizer=adamuon`` on a tiny recipe), inside Megatron with a
checkpoint resume in tests/megatron_cpu/test_megatron_training.py."""

from __future__ import annotations

import math

import pytest
import torch
from emerging_optimizers.orthogonalized_optimizers.adaptive_muon import AdaptiveMuon
from nemo_muon.recipes import get_recipe
from nemo_muon.recipes.overrides import apply_overrides

from nemo_muon.accounting.planner import plan_recipe
from nemo_muon.optim import build_optimizer
from nemo_muon.optim.adamuon import AdaMuon
from nemo_muon.optim.muon import muon_scale
from nemo_muon.registry.adamuon import AdaMuonConfig
from nemo_muon.run_checks import check_run
from tests.tolerances import FP32_U, adaptive_direction_tolerance

STEPS = 6
LR, WD, BETA2, EPS = 0.02, 0.1, 0.9, 1e-8


class SignStabilizedAdaptiveMuon(AdaptiveMuon):
    """emerging-optimizers' AdaMuon with the paper's sign before Newton–Schulz, through its documented extension point
    (``orthogonalize``)."""

    def orthogonalize(self, p: torch.Tensor, grad: torch.Tensor, **kwargs: object) -> torch.Tensor:
        return super().orthogonalize(p, grad.sign(), **kwargs)


def _grads(shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(STEPS)]


@pytest.mark.parametrize("sign", [True, False], ids=["sign", "no_sign"])
@pytest.mark.parametrize("shape, scale_mode, nesterov", [((64, 16), "spectral", True),
                                                         ((16, 64), "shape_scaling", False)], ids=["tall", "wide"])
def test_adamuon_equals_emerging_optimizers_adaptive_muon(sign, shape, scale_mode, nesterov):
    """The reference: ``AdaptiveMuon(moment2_method="adamuon")`` in fp32 ("highest"), with the paper's sign added
    through its ``orthogonalize`` for ``sign_stabilized``; same momentum, NS, V, ε, scale and decoupled weight decay
    (``rms_aligned=False``: emerging-optimizers does not rescale). The masters after 6 steps agree within
    `adaptive_direction_tolerance` per step (each run's Newton–Schulz within `GRAM_TOL` at aspect 4) times lr x the
    scale, plus fp32 rounding of the update; a Muon step, or the other sign setting, is far outside it."""
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    ours_p, ref_p, other_p = (torch.nn.Parameter(w.clone()) for _ in range(3))
    common = dict(lr=LR, weight_decay=WD, momentum=0.9, nesterov=nesterov, scale_mode=scale_mode, beta2=BETA2,
                  eps=EPS, rms_aligned=False)
    ours = build_optimizer(AdaMuonConfig(sign_stabilized=sign, **common), [("layers.0.mlp.down_proj.weight", ours_p)])
    other = build_optimizer(AdaMuonConfig(sign_stabilized=not sign, **common), [("layers.0.mlp.down_proj.weight",
                                                                                  other_p)])
    reference = SignStabilizedAdaptiveMuon if sign else AdaptiveMuon
    ref = reference([ref_p], lr=LR, momentum=0.9, weight_decay=WD, nesterov=nesterov, fp32_matmul_prec="highest",
                    coefficient_type="quintic", num_ns_steps=5, scale_mode=scale_mode, moment2_method="adamuon",
                    beta2=BETA2, eps=EPS)
    assert type(ours) is AdaMuon
    direction_tol = torch.zeros(shape)
    for g in _grads(shape, 1):
        for p in (ours_p, ref_p, other_p):
            p.grad = g.clone()
        ours.step()
        ref.step()
        other.step()
        direction_tol += adaptive_direction_tolerance(ref.state[ref_p]["moment2_buffer"], BETA2, EPS)
    scale = LR * muon_scale(*shape, scale_mode)
    rounding = 8 * STEPS * FP32_U * (ref_p.detach().abs() + scale / math.sqrt(1 - BETA2))
    tolerance = scale * direction_tol + rounding
    diff = (ours_p - ref_p).detach().abs()
    assert (diff <= tolerance).all(), (diff - tolerance).max()
    assert tolerance.median() < 0.01 * STEPS * scale  # the bound is tight enough to see a 1% change of the update
    assert (other_p - ref_p).detach().abs().median() > 10 * tolerance.median()  # the sign is really there (or not)


def test_the_rms_aligned_update_is_the_papers_per_part_and_per_expert():
    """The paper's γ = 0.2·√(mn)/‖Ô‖_F: with ``scale_mode='match_rms_adamw'`` (the default) the update of each fused
    part (gate, up) and of each expert equals the unrescaled direction (``rms_aligned=False``) rescaled to RMS 0.2 on
    its own. Both runs see the same NS inputs and compute the same Ô, so they differ by the rounding of the norms
    (a sum of m·n squares: (m·n)·u relative) and a few products; the state a step builds is the one a checkpoint load
    copies into (`placeholder_state`)."""
    named = {"mlp.gate_up_proj": (32, 48), "mlp.experts.down_proj": (3, 16, 40)}
    params = {key: [torch.nn.Parameter(torch.zeros(shape)) for _ in range(2)] for key, shape in named.items()}
    paper = build_optimizer(AdaMuonConfig(lr=1.0, weight_decay=0.0, beta2=BETA2),
                            [(k, ps[0]) for k, ps in params.items()])
    raw = build_optimizer(AdaMuonConfig(lr=1.0, weight_decay=0.0, beta2=BETA2, rms_aligned=False),
                          [(k, ps[1]) for k, ps in params.items()])
    for step, (g_fused, g_stack) in enumerate(zip(_grads(named["mlp.gate_up_proj"], 2),
                                                   _grads(named["mlp.experts.down_proj"], 3), strict=True)):
        for key, g in (("mlp.gate_up_proj", g_fused), ("mlp.experts.down_proj", g_stack)):
            for p in params[key]:
                p.detach().zero_()  # lr 1, no decay: the parameter after the step is minus the update
                p.grad = g.clone()
        paper.step()
        raw.step()
        for key, (a, b) in params.items():
            ours, direction = -a.detach(), -b.detach()
            blocks = direction.chunk(2) if key == "mlp.gate_up_proj" else direction.unbind()
            expected = torch.cat([d * (0.2 * math.sqrt(d.numel()) / torch.linalg.vector_norm(d)) for d in blocks])
            expected = expected.reshape(ours.shape)
            rtol = (max(d.numel() for d in blocks) + 8) * FP32_U
            assert ((ours - expected).abs() <= rtol * expected.abs()).all(), (step, key)
            parts = ours.chunk(2) if key == "mlp.gate_up_proj" else ours.unbind()
            assert all(abs(float(p.square().mean().sqrt()) - 0.2) < 1e-5 for p in parts)
    placeholder = build_optimizer(AdaMuonConfig(lr=1.0), [(k, ps[0]) for k, ps in params.items()])
    for p, _ in params.values():
        placeholder.placeholder_state(p)
        built = {k: (v.shape, v.dtype) for k, v in paper.state[p].items()}
        assert {k: (v.shape, v.dtype) for k, v in placeholder.state[p].items()} == built
    assert set(paper.state[params["mlp.gate_up_proj"][0]]) == {"momentum_buffer", "moment2_0", "moment2_1"}


def test_planned_checked_and_refused_through_its_registry_entry():
    """No table names AdaMuon: the registry's entry makes an override switch to it, plans its state (momentum and an
    element-wise moment), counts its Newton–Schulz, refuses Megatron's own engine and a split target, and validates
    its fields naming them."""
    recipe = apply_overrides(get_recipe("tiny_kimi_k2_muon"), ["optimizer=adamuon"])
    assert type(recipe.optimizer) is AdaMuonConfig and recipe.optimizer.scale_mode == "match_rms_adamw"
    check_run(recipe)
    plan, muon_plan = plan_recipe(recipe), plan_recipe(get_recipe("tiny_kimi_k2_muon"))
    assert plan["optimizer"] == "adamuon" and plan["ns_flops_per_step"] == muon_plan["ns_flops_per_step"] > 0
    by = plan["optimizer_state_bytes_per_rank_by_optimizer"]
    assert by["muon"] < by["normuon"] < by["adamuon"] < by["soap"]
    megatron = apply_overrides(get_recipe("kimi_k2_muon"), ["optimizer=adamuon"])
    check_run(megatron)
    with pytest.raises(ValueError, match=r"adamuon.engine='megatron' cannot be honoured by Megatron-Core: AdaMuon "
                                         r"runs inside Megatron-Core with engine 'nemo_muon' only"):
        check_run(apply_overrides(megatron, ["optimizer.engine=megatron"]))
    with pytest.raises(ValueError, match=r"adamuon.ns_split_target must be None: AdaMuon does not split"):
        check_run(apply_overrides(recipe, ["optimizer.ns_split_target=1.02"]))
    with pytest.raises(ValueError, match=r"adamuon.beta2 must be a number in \[0.0, 1.0\); got 1.0"):
        AdaMuonConfig(beta2=1.0)
    with pytest.raises(ValueError, match=r"adamuon.eps must be a number in \(0.0, inf\); got 0.0"):
        AdaMuonConfig(eps=0.0)
    with pytest.raises(ValueError, match=r"param_groups\[0\]: adamuon.beta2 must be a number"):
        AdaMuon([{"params": [torch.nn.Parameter(torch.zeros(4, 4))], "param_names": ["w"], "beta2": 2.0}], lr=0.1)
