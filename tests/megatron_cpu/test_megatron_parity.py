"""What Megatron-LM's own optimizer tests exercise, asked of our engine built in place of Megatron's Muon (issue 35
item 1), written from what the behaviour must be: a model with no attention (a plain linear stack under a placeholder
`TransformerConfig` without head sizes) builds and trains, a learning rate of 0 is built and leaves every weight where
it was. Runs on every Megatron-Core in the CPU harness; where ours differs on purpose: docs/optimizers.md ("Inside
Megatron: where ours differs from Megatron's own engine")."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from tests.distributed import run_distributed

MCORE = importlib.metadata.version("megatron-core")


def _placeholder_config() -> Any:
    """A `TransformerConfig` as Megatron's optimizer tests wrap plain modules: no head size (kv_channels 0)."""
    from megatron.core.transformer import TransformerConfig

    return TransformerConfig(num_layers=1, hidden_size=1, num_attention_heads=4, use_cpu_initialization=True)


def test_fused_layouts_are_built_only_for_parameters_that_have_them():
    from nemo_muon.megatron.shared.engine import FUSED_QKV, fused_layouts

    config = _placeholder_config()
    assert config.kv_channels == 0
    assert fused_layouts(config, 1, ["0.weight", "1.weight", "decoder.layers.0.mlp.linear_fc1.weight"]) == {}
    with pytest.raises(ValueError, match=r"QKVLayout.head_dim must be an integer >= 1; got 0"):
        fused_layouts(config, 1, [f"decoder.layers.0.self_attention.{FUSED_QKV}.weight"])  # a real QKV needs sizes


def _plain_linear_stack(rank: int, world_size: int, group: Any, lr: float, steps: int) -> dict[str, Any]:
    """Three bias-free 16 x 16 linear layers under the placeholder config, DDP-wrapped, our Muon inside Megatron's
    layer-wise optimizer at ``lr``; ``steps`` steps on rank-seeded data."""
    import dataclasses

    import torch
    import torch.distributed as dist

    from nemo_muon.megatron.shared.build import build_megatron_optimizer
    from tests.megatron_cpu.training import _ddp, _pg_collection, megatron_parallel, optimizer_config, settle

    with megatron_parallel():
        torch.manual_seed(0)
        model = torch.nn.Sequential(*(torch.nn.Linear(16, 16, bias=False) for _ in range(3)))
        config = _placeholder_config()
        opt = dataclasses.replace(optimizer_config("muon"), lr=lr)
        ddp_model = _ddp(model, config, opt, True, layout="legacy")
        ddp_model.broadcast_params()
        optimizer, _ = build_megatron_optimizer(opt, [ddp_model], pg_collection=_pg_collection(), min_lr=0.0)
        before = [p.detach().clone() for p in ddp_model.module.parameters()]
        gen = torch.Generator().manual_seed(100 + rank)
        losses = []
        for _ in range(steps):
            optimizer.zero_grad()
            ddp_model.zero_grad_buffer()
            x = torch.randn(8, 16, generator=gen)
            loss = ddp_model(x).square().mean()
            loss.backward()
            ddp_model.finish_grad_sync()
            ok, _, _ = optimizer.step()
            assert ok
            losses.append(float(loss))
        settle(ddp_model)
        moved = max(float((p.detach() - b).abs().max()) for p, b in zip(ddp_model.module.parameters(), before,
                                                                        strict=True))
        flat = torch.cat([p.detach().float().reshape(-1) for p in ddp_model.module.parameters()])
        replicas = [torch.zeros_like(flat) for _ in range(world_size)]
        dist.all_gather(replicas, flat, group=group)
        return {"moved": moved, "losses": losses, "classes": [type(o).__name__ for o in _leaves(optimizer)],
                "replica_max_diff": max(float((replicas[0] - r).abs().max()) for r in replicas)}


def _leaves(optimizer: Any) -> list[Any]:
    from nemo_muon.megatron.shared.engine import megatron_leaves

    return [getattr(leaf, "optimizer", leaf) for leaf in megatron_leaves(optimizer)]


def test_a_plain_linear_stack_trains_with_our_engine_inside_megatron():
    """No attention, no head size in the config: no QKV layout is asked for, the stack trains, replicas agree."""
    for result in run_distributed(_plain_linear_stack, world_size=2, args=(0.02, 3), timeout_s=240):
        assert "MegatronMuon" in result["classes"]
        assert result["moved"] > 0 and result["replica_max_diff"] == 0.0
        assert result["losses"][-1] < result["losses"][0]


def test_a_learning_rate_of_zero_is_built_and_moves_no_weight():
    """Megatron accepts lr 0 (its scheduler's warm-up starts there; a frozen phase): ours is built at 0 and two steps
    leave every weight bit for bit where it was (weight decay is lr-scaled)."""
    for result in run_distributed(_plain_linear_stack, world_size=2, args=(0.0, 2), timeout_s=240):
        assert "MegatronMuon" in result["classes"]
        assert result["moved"] == 0.0 and result["replica_max_diff"] == 0.0


def test_megatrons_own_refusals_stand_before_our_engine_is_built():
    """Our engine goes through Megatron's validation in Megatron's order: on 0.18+ through its own
    `get_megatron_optimizer` (fp16 and a param gather overlapped with the step refused in its words, before any
    optimizer of ours is constructed); on 0.16 / 0.17 (no registry: our assembly stands in for Megatron's) the assembly
    refuses fp16 in one line before it builds anything."""
    import torch
    from megatron.core.optimizer import OptimizerConfig as MCoreOptimizerConfig

    from nemo_muon.megatron.generations import entry, installed_core_generation
    from tests.megatron_cpu.training import optimizer_config

    generation = installed_core_generation()
    build, chunks = entry(generation.build_engine), [torch.nn.Linear(4, 4, bias=False)]
    ours = optimizer_config("muon")
    fp16 = MCoreOptimizerConfig(optimizer="adam", lr=1e-3, fp16=True)
    if generation.name == "core_018_plus":  # the mapping writes Megatron's config so (megatron_optimizer_spec)
        fp16.use_layer_wise_distributed_optimizer = True
        with pytest.raises(ValueError, match=r"^emerging optimizer with fp16 is not supported\.$"):
            build(ours, fp16, chunks, object())
        overlapped = MCoreOptimizerConfig(optimizer="adam", lr=1e-3, bf16=True,
                                          overlap_param_gather_with_optimizer_step=True,
                                          use_layer_wise_distributed_optimizer=True)
        with pytest.raises(AssertionError, match="overlap_param_gather_with_optimizer_step is not supported with "
                                                 "use_layer_wise_distributed_optimizer"):
            build(ours, overlapped, chunks, object())
    else:
        with pytest.raises(ValueError, match=r"the layer-wise optimizer needs use_distributed_optimizer=False and "
                                             r"fp16=False; got use_distributed_optimizer=False, fp16=True"):
            build(ours, fp16, chunks, object())
