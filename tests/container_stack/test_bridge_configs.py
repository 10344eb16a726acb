"""Every megatron-backend recipe builds its real Megatron-Bridge 0.3.0 `ConfigContainer` and passes what Bridge's
`pretrain()` runs on it first (`runtime_config_update`: mixed precision and comm-overlap setup, `validate()`) at the
recipe's world size, on the recipe's target GPU; what the stack cannot run is refused before anything is built."""

from __future__ import annotations

import dataclasses

import pytest
from nemo_muon.recipes import get_recipe, list_recipes

from nemo_muon.megatron.bridge.container import build_config_container, config_container
from nemo_muon.megatron.shared.stack import installed_versions, problems_for_optimizer
from nemo_muon.versions import get_release
from tests.megatron_cpu.bridge_validation import target_machine

MEGATRON_RECIPES = [n for n in list_recipes() if get_recipe(n).backend == "megatron"]
TE_VERSION = get_release("26.02").transformer_engine


def _validated(name: str, monkeypatch: pytest.MonkeyPatch):
    from megatron.bridge.training.config import runtime_config_update

    recipe = get_recipe(name)
    monkeypatch.setenv("WORLD_SIZE", str(recipe.system.world_size))
    with target_machine(recipe.system.gpu, TE_VERSION):
        container = config_container(recipe)
        runtime_config_update(container)
    return recipe, container


def test_there_are_megatron_recipes_of_both_families():
    models = {get_recipe(n).model.name for n in MEGATRON_RECIPES}
    assert models == {"kimi_k2", "qwen3_30b_a3b"}


@pytest.mark.parametrize("name", MEGATRON_RECIPES)
def test_recipe_builds_and_validates(name, bridge, monkeypatch):
    recipe, c = _validated(name, monkeypatch)
    m = c.model
    par = recipe.parallelism
    assert (m.tensor_model_parallel_size, m.pipeline_model_parallel_size, m.expert_model_parallel_size) == (
        par.tp, par.pp, par.ep)
    assert c.data_parallel_size == recipe.system.world_size // (par.tp * par.pp * par.cp)
    assert (c.train.global_batch_size, c.train.micro_batch_size, c.train.train_iters) == (
        recipe.trainer.global_batch_size, recipe.trainer.micro_batch_size, recipe.trainer.max_steps)
    assert dataclasses.is_dataclass(c.mixed_precision)  # the preset is resolved, not left as a name
    assert c.optimizer.lr == recipe.optimizer.lr
    assert c.checkpoint.ckpt_format == "torch_dist"  # every save its own folder (docs/megatron_cpu.md)
    assert c.scheduler.start_weight_decay == c.scheduler.end_weight_decay == recipe.optimizer.weight_decay
    is_adam = recipe.optimizer.name == "adamw"
    assert c.ddp.use_distributed_optimizer is is_adam
    assert c.optimizer.optimizer == {"adamw": "adam", "muon": "dist_muon", "soap": "dist_soap"}[recipe.optimizer.name]
    if recipe.precision.kind == "mxfp8":
        assert c.mixed_precision.fp8_recipe == "mxfp8"
        assert c.ddp.fp8_param_gather is is_adam  # Bridge's WAR: no MXFP8 param gather with the layer-wise optimizer
    if m.moe_token_dispatcher_type == "flex":
        assert m.moe_shared_expert_overlap is False  # what broke Kimi K2's validation before
    if m.cuda_graph_impl != "none":
        assert m.recompute_granularity != "full" and m.use_te_rng_tracker  # what broke Qwen3 validation before


def test_validation_is_real_it_refuses_what_bridge_refuses(bridge, monkeypatch):
    """The old failures come back when the fixes are undone: Bridge's validation is what runs here."""
    from megatron.bridge.training.config import runtime_config_update

    recipe = get_recipe("kimi_k2_adamw")
    monkeypatch.setenv("WORLD_SIZE", str(recipe.system.world_size))
    with target_machine(recipe.system.gpu, TE_VERSION):
        c = config_container(recipe)
        c.model.moe_shared_expert_overlap = True
        with pytest.raises((ValueError, AssertionError), match="(?i)shared.expert.overlap|flex"):
            runtime_config_update(c)
    recipe = get_recipe("qwen3_30b_a3b_adamw")
    monkeypatch.setenv("WORLD_SIZE", str(recipe.system.world_size))
    with target_machine(recipe.system.gpu, TE_VERSION):
        c = config_container(recipe)
        c.model.recompute_granularity, c.model.recompute_method, c.model.recompute_num_layers = "full", "uniform", 1
        with pytest.raises((ValueError, AssertionError), match="(?i)recompute|cuda.graph"):
            runtime_config_update(c)
    recipe = get_recipe("kimi_k2_adamw")
    monkeypatch.setenv("WORLD_SIZE", "3")  # 3 GPUs cannot hold PP4 x EP64
    with target_machine(recipe.system.gpu, TE_VERSION), pytest.raises((ValueError, AssertionError, RuntimeError)):
        runtime_config_update(config_container(recipe))


def test_hybridep_is_refused_on_a_gpu_without_it(bridge, monkeypatch):
    recipe = get_recipe("qwen3_30b_a3b_adamw")  # GB300 preset: flex dispatcher with HybridEP
    monkeypatch.setenv("WORLD_SIZE", str(recipe.system.world_size))
    from megatron.bridge.training.config import runtime_config_update

    from tests.megatron_cpu import bridge_validation

    monkeypatch.setitem(bridge_validation.TARGET_GPUS, "gb300", bridge_validation.GpuProperties(
        "Tesla T4", 7, 5, 16 * 2**30, 40))
    with target_machine("gb300", TE_VERSION):
        with pytest.raises(ValueError, match="HybridEP is supported for"):
            runtime_config_update(config_container(recipe))


@pytest.mark.parametrize("name", [n for n in MEGATRON_RECIPES if get_recipe(n).optimizer.name == "soap"])
def test_megatrons_own_soap_is_refused_before_building(name, bridge):
    recipe = get_recipe(name)
    own = recipe.replace(optimizer=dataclasses.replace(recipe.optimizer, engine="megatron"))
    assert problems_for_optimizer("soap", installed_versions(), engine="megatron"), "megatron-core 0.16 has no SOAP"
    with pytest.raises(ValueError, match="optimizer.name='soap' with optimizer.engine='megatron' cannot run on the "
                                         "installed stack"):
        build_config_container(own)


def test_megatrons_own_muon_is_refused_naming_the_combination_and_the_fix(bridge):
    """Muon recipes run nemo-muon's Muon (engine 'nemo_muon', built by build_config_container above); Megatron-Core
    0.16's own Muon, chosen explicitly, is refused before anything is built."""
    recipe = get_recipe("kimi_k2_muon")
    assert recipe.optimizer.engine == "nemo_muon" and build_config_container(recipe).optimizer.optimizer == "dist_muon"
    own = recipe.replace(optimizer=dataclasses.replace(recipe.optimizer, engine="megatron"))
    with pytest.raises(ValueError) as err:
        build_config_container(own)
    text = str(err.value)
    assert "megatron-core 0.16.0" in text and "emerging-optimizers 0.3.0" in text
    assert "use_nesterov" in text and "v0.1.0" in text and "optimizer.engine=nemo_muon" in text


@pytest.mark.parametrize("nonfinite, checks", [("raise", True), ("skip", False)])
def test_skip_policy_turns_bridges_local_nan_checks_off_and_validates(nonfinite, checks, bridge, monkeypatch):
    """Engine nemo_muon with ``optimizer.nonfinite='skip'`` decides on the global gradient norm on every rank; DDP's
    local NaN check (fatal, on the one rank that saw the NaN, before the reduction) and Bridge's NaN-loss check would
    pre-empt it, so the built ConfigContainer has both off (Bridge's own value) and still validates; 'raise' (the
    recipes' default) keeps both on."""
    from megatron.bridge.training.config import runtime_config_update
    from nemo_muon.recipes.execute import build_recipe

    recipe = build_recipe("qwen3_30b_a3b_muon", [f"optimizer.nonfinite={nonfinite}"])
    monkeypatch.setenv("WORLD_SIZE", str(recipe.system.world_size))
    with target_machine(recipe.system.gpu, TE_VERSION):
        c = config_container(recipe)
        runtime_config_update(c)
    assert c.ddp.check_for_nan_in_grad is checks
    assert c.rerun_state_machine.check_for_nan_in_loss is checks


def test_bridge_03_reads_the_hugging_face_config_the_run_names(bridge, tmp_path):
    """Bridge 0.3's Qwen3 library recipe builds its model from config.json: the one nemo-muon ships, offline, or
    the folder ``hf_config`` names (was: the Hub id's, through the HF cache, ``hf_config`` silently ignored)."""
    import json

    from nemo_muon.recipes.execute import build_recipe

    from nemo_muon.megatron.bridge.hf_config import SHIPPED_HF_CONFIGS

    config = json.loads((SHIPPED_HF_CONFIGS / "qwen3_30b_a3b" / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 24}))
    recipe = get_recipe("qwen3_30b_a3b_muon")
    with target_machine(recipe.system.gpu, TE_VERSION):
        assert config_container(recipe).model.num_layers == 48
        assert config_container(build_recipe(recipe.name, [f"hf_config={tmp_path}"])).model.num_layers == 24
