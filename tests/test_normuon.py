"""NorMuon (`nemo_muon.optim.normuon`, registered in `nemo_muon.registry.normuon`): its update against the reference
implementation of emerging-optimizers, on fused weights and 3-D expert stacks, refusals, and how the house plans it.
Training on the torch backend's whole-tensor optimizer is in tests/test_layerwise_optimizer.py, inside Megatron's
layer-wise optimizer in tests/megatron_cpu/test_megatron_training.py, the recipe in tests/test_recipes.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from emerging_optimizers.orthogonalized_optimizers.adaptive_muon import AdaptiveMuon
from nemo_muon.recipes import get_recipe

from nemo_muon.accounting.planner import plan_recipe
from nemo_muon.config.optimizer import MuonConfig
from nemo_muon.layerwise.plan_items import plan_item
from nemo_muon.optim import build_optimizer
from nemo_muon.optim.normuon import NorMuon
from nemo_muon.registry.normuon import NorMuonConfig
from nemo_muon.run_checks import check_run

STEPS = 6


def _grads(shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g) for _ in range(STEPS)]


@pytest.mark.parametrize("shape", [(48, 24), (16, 40)], ids=["tall", "wide"])
@pytest.mark.parametrize("scale_mode, nesterov", [("spectral", True), ("shape_scaling", False)])
def test_normuon_equals_emerging_optimizers_adaptive_muon(shape, scale_mode, nesterov):
    """The reference: ``AdaptiveMuon(moment2_method="normuon")`` in fp32 ("highest" matmul precision), same
    momentum, NS coefficients and steps, scale, decoupled weight decay, beta2 and eps: equal within fp32 rounding of
    the two Newton–Schulz implementations after 6 steps, and far from a plain Muon step."""
    w = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    ours_p, ref_p, muon_p = (torch.nn.Parameter(w.clone()) for _ in range(3))
    cfg = NorMuonConfig(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov, scale_mode=scale_mode,
                        beta2=0.9, eps=1e-7)
    ours = build_optimizer(cfg, [("layers.0.mlp.down_proj.weight", ours_p)])
    muon_fields = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(MuonConfig) if f.init}
    muon = build_optimizer(MuonConfig(**muon_fields), [("layers.0.mlp.down_proj.weight", muon_p)])
    ref = AdaptiveMuon([ref_p], lr=0.02, momentum=0.9, weight_decay=0.1, nesterov=nesterov,
                       fp32_matmul_prec="highest", coefficient_type="quintic", num_ns_steps=5, scale_mode=scale_mode,
                       moment2_method="normuon", beta2=0.9, eps=1e-7)
    assert type(ours) is NorMuon
    for g in _grads(shape, 1):
        for p in (ours_p, ref_p, muon_p):
            p.grad = g.clone()
        ours.step()
        ref.step()
        muon.step()
    assert torch.allclose(ours_p, ref_p, rtol=0, atol=2e-5), (ours_p - ref_p).abs().max()
    assert (ours_p - muon_p).abs().max() > 100 * (ours_p - ref_p).abs().max()  # the normalization is really there


def test_fused_parts_and_expert_stacks_are_each_their_own_matrix():
    """A fused [gate; up] weight (split_gate_up) equals gate and up as two parameters, and a 3-D stack of experts
    equals each expert as its own parameter: every part has its own second moment and norm."""
    cfg = NorMuonConfig(lr=0.03, weight_decay=0.0)
    gate, up = torch.randn(12, 20), torch.randn(12, 20)
    fused = torch.nn.Parameter(torch.cat([gate, up]))
    apart = [torch.nn.Parameter(gate.clone()), torch.nn.Parameter(up.clone())]
    stack = torch.nn.Parameter(torch.randn(3, 16, 10))
    experts = [torch.nn.Parameter(stack[e].detach().clone()) for e in range(3)]
    a = build_optimizer(cfg, [("mlp.gate_up_proj", fused), ("mlp.experts.down_proj", stack)])
    b = build_optimizer(cfg, [("mlp.gate_proj", apart[0]), ("mlp.up_proj", apart[1])]
                        + [(f"mlp.experts.{e}.down_proj", experts[e]) for e in range(3)])
    for g_fused, g_stack in zip(_grads((24, 20), 2), _grads((3, 16, 10), 3), strict=True):
        fused.grad, stack.grad = g_fused.clone(), g_stack.clone()
        apart[0].grad, apart[1].grad = (t.clone() for t in g_fused.chunk(2))
        for e in range(3):
            experts[e].grad = g_stack[e].clone()
        a.step()
        b.step()
    torch.testing.assert_close(fused.detach(), torch.cat([p.detach() for p in apart]), rtol=0, atol=1e-6)
    torch.testing.assert_close(stack.detach(), torch.stack([p.detach() for p in experts]), rtol=0, atol=1e-6)
    assert {k for k in a.state[fused]} == {"momentum_buffer", "moment2_0", "moment2_1"}


def test_the_placeholder_state_a_checkpoint_loads_into_is_the_state_a_step_builds():
    """Megatron's checkpoint load copies into the placeholder state (``placeholder_state``), so every second moment
    must exist there with its shape and dtype: fused parts, expert stacks, tall and wide matrices."""
    cfg = NorMuonConfig(lr=0.03, weight_decay=0.0)
    named = [("mlp.gate_up_proj", torch.nn.Parameter(torch.randn(24, 20))),
             ("mlp.experts.down_proj", torch.nn.Parameter(torch.randn(3, 16, 10))),
             ("attn.o_proj", torch.nn.Parameter(torch.randn(8, 40)))]
    stepped = build_optimizer(cfg, named)
    for _, p in named:
        p.grad = torch.randn_like(p)
    stepped.step()
    placeholder = build_optimizer(cfg, named)
    for _, p in named:
        placeholder.placeholder_state(p)
        built = {k: (v.shape, v.dtype) for k, v in stepped.state[p].items()}
        assert {k: (v.shape, v.dtype) for k, v in placeholder.state[p].items()} == built


def test_bad_values_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"normuon.beta2 must be a number in \[0.0, 1.0\); got 1.0"):
        NorMuonConfig(beta2=1.0)
    with pytest.raises(ValueError, match=r"normuon.eps must be a number in \(0.0, inf\); got 0.0"):
        NorMuonConfig(eps=0.0)
    with pytest.raises(ValueError, match=r"normuon.momentum must be a number in \[0.0, 1.0\); got 1.5"):
        NorMuonConfig(momentum=1.5)


def test_on_the_megatron_backend_only_our_engine_runs_it():
    """Megatron-Core has no NorMuon: engine 'megatron' is refused before launch (the megatron mapping's rule, which
    every entry point's validation runs), naming the field and the engine there is."""
    from nemo_muon.recipes.overrides import apply_overrides

    recipe = apply_overrides(get_recipe("kimi_k2_muon_split"), ["optimizer=normuon"])
    check_run(recipe)
    # the switch keeps Muon's fields but the split target, which NorMuon cannot honour (whole tensors)
    shipped = get_recipe("kimi_k2_muon_split").optimizer
    assert shipped.ns_split_target == 1.02 and recipe.optimizer.ns_split_target is None
    assert recipe.optimizer.ns_precision == shipped.ns_precision
    assert recipe.optimizer.collectives == shipped.collectives == "reduce_scatter"
    with pytest.raises(ValueError, match=r"normuon.engine='megatron' cannot be honoured by Megatron-Core: NorMuon runs "
                                         r"inside Megatron-Core with engine 'nemo_muon' only"):
        check_run(apply_overrides(recipe, ["optimizer.engine=megatron", "optimizer.collectives=all_reduce"]))


def test_planned_and_costed_as_muon_with_its_own_state():
    """The plan's ownership cost of a NorMuon matrix is Muon's (the same Newton–Schulz; the normalization is
    element-wise), its state one momentum plus one value per row of the longer side, and the recipe's plan names
    it: NS counted; no split ownership (the whole-tensor optimizer splits NS over slices; the row moment needs the whole), and a
    split target is refused, not ignored."""
    w = torch.zeros(64, 32)
    normuon, muon = NorMuonConfig(), MuonConfig()
    assert plan_item("layers.0.mlp.down_proj.weight", w, normuon, splittable=False).cost == \
        plan_item("layers.0.mlp.down_proj.weight", w, muon, splittable=False).cost > 0
    recipe = get_recipe("tiny_kimi_k2_normuon")
    plan, muon_plan = plan_recipe(recipe), plan_recipe(get_recipe("tiny_kimi_k2_muon"))
    assert plan["optimizer"] == "normuon"
    assert plan["ns_flops_per_step"] == muon_plan["ns_flops_per_step"] > 0
    by = plan["optimizer_state_bytes_per_rank_by_optimizer"]
    assert by["muon"] < by["normuon"] < by["muon"] * 1.1
    assert plan["ns_split"] is None and muon_plan["ns_split"] is not None
    with pytest.raises(ValueError, match=r"normuon.ns_split_target must be None: NorMuon does not split"):
        check_run(recipe.replace(optimizer=dataclasses.replace(recipe.optimizer, ns_split_target=1.02)))
