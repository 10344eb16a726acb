"""The plan `nemo-muon plan` prints is the plan the whole-tensor optimizer executes (issue 15).

For the torch backend's recipes the CLI's JSON (per-rank NS FLOPs, imbalance, split matrices, their ways and the
extra bytes per rank) must equal what `WholeTensorOptimizer`, built by the torch backend itself
(`train.optimizers.build_training_optimizer`) on 4 gloo ranks over the recipe's HF model, planned and runs: with
whole-tensor ownership and with splits (``ns_split_target=1.0`` makes LPT split until nothing more helps).
The planner is torch-free and counts tensors from the ModelSpec alone (``CostModel.tensors='hf'``), so an
agreement here checks its model of the HF tensors against the real ones. The megatron side (our ownership inside
Megatron-Core 0.16) is checked in tests/megatron_cpu/test_megatron_training.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner
from nemo_muon.launchers.plan import plan

from tests.distributed import run_distributed

WORLD = 4
CASES: tuple[tuple[str, float | None], ...] = (
    ("tiny_kimi_k2_muon", None),
    ("tiny_kimi_k2_muon", 1.0),
    ("tiny_qwen3_moe_muon", 1.0),
)


def _overrides(target: float | None) -> list[str]:
    return [] if target is None else [f"optimizer.ns_split_target={target}"]


def _optimizer_plans(rank: int, world_size: int, group: Any) -> list[dict[str, Any]]:
    from nemo_muon.recipes.execute import build_recipe

    from nemo_muon.models.hf import build_model
    from nemo_muon.train.optimizers import build_training_optimizer

    out = []
    for name, target in CASES:
        recipe = build_recipe(name, _overrides(target))
        opt = build_training_optimizer(recipe, build_model(recipe.model, seed=recipe.trainer.seed), group=group)
        p = opt.whole_tensor.plans[0]
        out.append({"flops": list(p.flops), "imbalance": p.imbalance, "split_bytes": list(p.split_bytes),
                    "ways": sorted(sp.option.ways for sp in p.splits.values())})
    return out


def _printed(name: str, target: float | None) -> dict[str, Any]:
    args = ["--recipe", name, "--gpus", str(WORLD), "--json"]
    for o in _overrides(target):
        args += ["--set", o]
    res = CliRunner().invoke(plan, args)
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_printed_plan_is_the_torch_engines_plan() -> None:
    ranks = run_distributed(_optimizer_plans, world_size=WORLD, timeout_s=300)
    assert all(r == ranks[0] for r in ranks)  # every rank computes the same plan, with no communication
    splits_seen = 0
    for (name, target), executed in zip(CASES, ranks[0], strict=True):
        printed = _printed(name, target)
        split = printed["ns_split"]
        assert split["executed"] is (target is not None), (name, split)
        assert printed["ns_flops_per_rank_max"] == pytest.approx(max(executed["flops"]), rel=1e-12), name
        assert printed["ns_flops_per_rank_mean"] == pytest.approx(sum(executed["flops"]) / WORLD, rel=1e-12), name
        assert printed["ns_imbalance"] == pytest.approx(executed["imbalance"], rel=1e-12), name
        if target is not None:
            assert split["split_matrices"] == len(executed["ways"]), name
            assert split["ways"] == sorted(set(executed["ways"])), name
            assert split["extra_bytes_per_rank_max"] == pytest.approx(max(executed["split_bytes"]), rel=1e-12), name
            assert split["ns_imbalance"] == pytest.approx(executed["imbalance"], rel=1e-12), name
            splits_seen += len(executed["ways"])
    assert splits_seen > 0  # the split cases really split: the comparison covers split placements
