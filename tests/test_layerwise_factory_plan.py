"""The layer-wise plan of an optimizer factory costs what the factory's optimizer routes (layerwise/plan_items.py).

A factory's Muon with its own ``matrix_rule`` sends two matrices to AdamW: they cost 0 in the plan (the default rule
would charge them Newton–Schulz); its fused layouts, ``ns_steps`` and SOAP's ``precondition_frequency`` are read
from the built optimizer; a plain torch optimizer is costed as element-wise (0, placed by bytes). On 2 gloo ranks
the whole-tensor optimizer with such a factory trains bit for bit as the single-process optimizer.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nemo_muon.config.optimizer import MuonConfig
from nemo_muon.layerwise.optimizer import WholeTensorOptimizer
from nemo_muon.layerwise.plan_items import whole_tensor_plan
from nemo_muon.optim.muon import Muon
from nemo_muon.optim.soap import SOAP
from nemo_muon.registry.cost import ns_cost, soap_cost
from tests.distributed import run_distributed
from tests.test_layerwise_optimizer import make_model, params_of, portable, tensors, train

TO_ADAMW = ("attn.weight", "proj.weight")


def rule(name: str | None, shape: tuple[int, ...]) -> str | None:
    """Send the attention matrices to AdamW; everything else follows the default rule."""
    return "adamw" if name in TO_ADAMW else None


def muon_factory(named: Any) -> torch.optim.Optimizer:
    return Muon(named, lr=2e-2, weight_decay=0.1, matrix_rule=rule)


def _costs(optimizer: Any, model: nn.Module) -> dict[str, float]:
    plan = whole_tensor_plan(list(model.named_parameters()), 2, optimizer, "lpt", split=False)
    return {it.name: it.cost for it in plan.items}


def test_a_factorys_matrix_rule_decides_the_cost() -> None:
    model = make_model()
    costs = _costs(muon_factory, model)
    assert all(costs[n] == 0.0 for n in TO_ADAMW)  # AdamW-routed by the factory's rule: placed by bytes
    assert costs["blocks.0.up.weight"] == ns_cost((24, 16)) > 0
    assert costs["embed_tokens.weight"] == costs["lm_head.weight"] == costs["blocks.0.norm.weight"] == 0.0
    config = _costs(MuonConfig(lr=2e-2), model)  # a config without a rule: the default rule, as before
    assert config["attn.weight"] == ns_cost((48, 16)) and config["blocks.0.up.weight"] == costs["blocks.0.up.weight"]


def test_the_built_optimizers_steps_layouts_and_frequency_are_read() -> None:
    model = nn.ModuleDict({"linear_fc1": nn.Linear(8, 12, bias=False), "out": nn.Linear(6, 8, bias=False)})
    named = list(model.named_parameters())
    muon = _costs(lambda named: Muon(named, lr=0.1, ns_steps=3), model)
    assert muon["linear_fc1.weight"] == 2 * ns_cost((6, 8), steps=3)  # [gate; up]: two matrices of NS
    assert muon["out.weight"] == ns_cost((8, 6), steps=3)
    soap = _costs(lambda named: SOAP(named, lr=0.1, precondition_frequency=3), model)
    assert soap["linear_fc1.weight"] == soap_cost((12, 8), 3)  # SOAP preconditions a fused weight whole
    assert _costs(lambda named: torch.optim.AdamW([p for _, p in named], lr=0.1), model) == {n: 0.0 for n, _ in named}
    if hasattr(torch.optim, "Muon"):  # torch's Muon orthogonalizes every (2-D) tensor it holds
        tm = _costs(lambda named: torch.optim.Muon([p for _, p in named], lr=0.1, ns_steps=4), model)
        assert tm["linear_fc1.weight"] == ns_cost((12, 8), steps=4)
    left_out = _costs(lambda named: Muon(named[:1], lr=0.1), model)  # never updated by the whole-tensor optimizer: cost 0
    assert left_out["out.weight"] == 0.0
    for built in (Muon(named, lr=0.1), SOAP(named, lr=0.1)):  # asking a built optimizer costs no state
        assert len(built.state) == 0


def _factory_body(rank: int, world: int, group: Any) -> dict[str, Any]:
    model = make_model()
    opt = WholeTensorOptimizer(model, muon_factory, dp_group=group, bucket_size_mb=0.002)
    train(model, opt, 3, rank, world)
    opt.finish_param_gather()
    return portable({"params": params_of(model), "owned": opt.owned_names,
                     "costs": {it.name: it.cost for it in opt.plans[0].items}})


def test_a_factory_whole_tensor_optimizer_trains_as_the_single_process_optimizer() -> None:
    ranks = tensors(run_distributed(_factory_body, world_size=2, timeout_s=150))
    model = make_model()
    train(model, muon_factory(list(model.named_parameters())), 3, micro=2)  # same sum order as DP=2
    want = params_of(model)
    for r in ranks:
        assert all(torch.equal(r["params"][n], want[n]) for n in want)
        assert all(r["costs"][n] == 0.0 for n in TO_ADAMW)
    owned = [set(r["owned"]) for r in ranks]
    assert owned[0] | owned[1] == set(want) and not owned[0] & owned[1]
