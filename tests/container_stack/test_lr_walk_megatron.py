"""``optimizer.lr`` from ``--factory kimi_k2_muon`` to our Muon's update on the megatron backend (NGC 26.02: Bridge
0.3's real ConfigContainer and setup_optimizer, Megatron-Core 0.16's layer-wise optimizer, one gloo rank): the
functions of ours it passes through (`tests.lr_walk`), at most 10; Megatron's config holds it once (our mapping) and
the scheduler's rate is what our optimizer's groups carry."""

from __future__ import annotations

from typing import Any

from tests.distributed import run_distributed
from tests.lr_walk import SENTINEL, walk
from tests.test_lr_walk import MAX_FUNCTIONS


def _factory_to_update(rank: int, world_size: int, group: Any) -> dict[str, Any]:
    from tests.megatron_cpu.te_stub import bridge_imports_without_te
    from tests.megatron_cpu.training import _forward_backward, megatron_parallel, replica

    with megatron_parallel():
        bridge_imports_without_te()
        from megatron.bridge.training.optim import setup_optimizer
        from nemo_muon.recipes.execute import build_recipe
        from nemo_muon.recipes.resolved import from_document, to_document

        from nemo_muon.megatron.bridge.container import build_config_container
        from nemo_muon.megatron.generations import entry, installed_bridge_generation

        def factory_to_update() -> list[float]:  # the CLI's process, then a rank's: Bridge's setup, one step
            overrides = [f"optimizer.lr={SENTINEL}"]
            recipe = from_document(to_document(build_recipe("kimi_k2_muon", overrides), source="kimi_k2_muon",
                                               overrides=overrides))
            container = build_config_container(recipe)
            generation = installed_bridge_generation()
            if generation.install_engine is not None:
                entry(generation.install_engine)(recipe.optimizer)
            run = replica("tiny_kimi_k2", build=False)  # the model is a tiny one; the optimizer path is the recipe's
            container.optimizer.finalize()
            scheduler = container.scheduler
            scheduler.lr_warmup_steps, scheduler.lr_decay_steps, scheduler.wd_incr_steps = 0, 10, 10
            optimizer, _ = setup_optimizer(container.optimizer, scheduler, [run.ddp_model],
                                           use_gloo_process_groups=False)
            _forward_backward(run.ddp_model, optimizer, 0, 0, run.spec.vocab_size)
            optimizer.step()
            return [container.optimizer.lr, *{g["lr"] for g in optimizer.param_groups}]

        (config_lr, *group_lrs), seen = walk(factory_to_update)
        return {"config_lr": config_lr, "group_lrs": group_lrs, "calls": seen.calls, "report": seen.report()}


def test_the_learning_rate_walks_through_at_most_ten_functions_on_the_megatron_backend(bridge):
    result = run_distributed(_factory_to_update, world_size=1, timeout_s=300, daemon=False)[0]
    assert len(result["calls"]) <= MAX_FUNCTIONS, result["report"]
    assert result["config_lr"] == SENTINEL  # Megatron's OptimizerConfig holds the recipe's rate (our one mapping)
    assert result["group_lrs"] == [SENTINEL]  # every group steps at the scheduler's rate (constant after warm-up)
    assert "nemo_muon.optim.muon.Muon.__init__" in result["calls"]
