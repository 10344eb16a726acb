"""Every megatron recipe builds its Megatron-Bridge 0.6 `ConfigContainer` from Bridge's own perf recipe (the
model read offline from the Hugging Face config.json nemo-muon ships, or the folder `recipe.hf_config` names), passes what Bridge's `pretrain()` runs
on it first (`runtime_config_update`: environment, precision and comm-overlap setup, `validate()`) at the recipe's
world size on its target GPU, and differs from that perf recipe only in the fields of `DELIBERATE_DIFFERENCES_06`."""

from __future__ import annotations

import dataclasses
import enum
import math
import shutil
from pathlib import Path

import pytest
from nemo_muon.recipes import get_recipe, list_recipes
from nemo_muon.recipes.execute import build_recipe

from nemo_muon.megatron.bridge.hf_config import HF_MODEL_IDS, SHIPPED_HF_CONFIGS
from nemo_muon.megatron.bridge_06.perf_recipes import (
    DELIBERATE_DIFFERENCES_06,
    perf_recipe_container,
    perf_recipe_target,
)
from nemo_muon.versions import get_release
from tests.megatron_cpu.bridge_validation import target_machine

MEGATRON_RECIPES = [n for n in list_recipes() if get_recipe(n).backend == "megatron"]
TE_VERSION = get_release("26.08").transformer_engine
HF_CONFIGS = {model: SHIPPED_HF_CONFIGS / model / "config.json" for model in HF_MODEL_IDS}
"""The public config.json of each model family, as shipped (Kimi K2's in DeepseekV3 form: the Hub's names remote
code); the tests pass copies as ``hf_config``, the override, and build without it too."""


@pytest.fixture(scope="session")
def hf_configs(tmp_path_factory) -> dict[str, Path]:
    out = {}
    for model, config in HF_CONFIGS.items():
        folder = tmp_path_factory.mktemp(model)
        shutil.copyfile(config, folder / "config.json")
        out[model] = folder
    return out


def _recipe(name: str, hf_configs: dict[str, Path], *overrides: str):
    return build_recipe(name, [f"hf_config={hf_configs[get_recipe(name).model.name]}", *overrides])


def _flat(container) -> dict[str, object]:
    """section.field -> value of every field of every section (one level: Bridge's sections are flat)."""
    out = {}
    for section in dataclasses.fields(container):
        value = getattr(container, section.name)
        if not dataclasses.is_dataclass(value):
            continue
        for f in dataclasses.fields(value):
            v = getattr(value, f.name, None)
            if not callable(v) or isinstance(v, enum.Enum):
                out[f"{section.name}.{f.name}"] = v
    return out


def _same(a: object, b: object) -> bool:
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool) | isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-12)
    return repr(a) == repr(b)


def _differing_fields(name: str, hf_configs) -> set[str]:
    from nemo_muon.megatron.bridge.container import config_container

    recipe = _recipe(name, hf_configs)
    ours, bridges = _flat(config_container(recipe)), _flat(perf_recipe_container(recipe))
    return {k for k in ours.keys() | bridges.keys() if not _same(ours.get(k, "<absent>"), bridges.get(k, "<absent>"))}


def test_every_megatron_recipe_has_a_bridge_06_perf_recipe(bridge):
    import importlib.util

    for name in MEGATRON_RECIPES:
        module = perf_recipe_target(get_recipe(name)).split(":")[0]
        assert importlib.util.find_spec(module) is not None, (name, module)
    assert set(HF_MODEL_IDS) == {get_recipe(n).model.name for n in MEGATRON_RECIPES}


@pytest.mark.parametrize("name", MEGATRON_RECIPES)
def test_recipe_builds_and_validates(name, bridge, hf_configs, monkeypatch):
    from megatron.bridge.training.config import runtime_config_update

    from nemo_muon.megatron.bridge.container import config_container
    from nemo_muon.megatron.bridge.container import routes_cost_layout as routes

    recipe = _recipe(name, hf_configs)
    monkeypatch.setenv("WORLD_SIZE", str(recipe.system.world_size))
    for variable in recipe.env:  # runtime_config_update sets the perf recipe's env defaults: keep them in the test
        monkeypatch.setenv(variable, recipe.env[variable])
    with target_machine(recipe.system.gpu, TE_VERSION):
        c = config_container(recipe)
        runtime_config_update(c)
    par = recipe.parallelism
    assert (c.model.tensor_model_parallel_size, c.model.pipeline_model_parallel_size,
            c.model.expert_model_parallel_size) == (par.tp, par.pp, par.ep)
    assert c.data_parallel_size == recipe.system.world_size // (par.tp * par.pp * par.cp)
    assert (c.train.global_batch_size, c.train.micro_batch_size, c.train.train_iters) == (
        recipe.trainer.global_batch_size, recipe.trainer.micro_batch_size, recipe.trainer.max_steps)
    assert c.model.num_layers == recipe.model.num_layers and c.model.hidden_size == recipe.model.hidden_size
    assert c.model.num_moe_experts == recipe.model.num_experts
    assert c.checkpoint.ckpt_format == "torch_dist"  # every save its own folder (docs/megatron_cpu.md)
    assert c.scheduler.start_weight_decay == c.scheduler.end_weight_decay == recipe.optimizer.weight_decay
    is_adam = recipe.optimizer.name == "adamw"
    # engine 'nemo_muon' on Bridge 0.6: DDP on the cost layout (reduce-scatter, all-gather in the next forward)
    cost_layout = routes(recipe.optimizer)
    assert c.ddp.use_distributed_optimizer is (is_adam or cost_layout)
    if cost_layout:
        assert c.ddp.overlap_param_gather and c.optimizer.use_distributed_optimizer
    assert type(c.optimizer).__name__ == ("OptimizerConfig" if is_adam else "EngineOptimizerConfig")
    if not is_adam:
        assert c.optimizer.engine_config == recipe.optimizer and c.optimizer.use_layer_wise_distributed_optimizer


def test_validation_is_real_it_refuses_what_bridge_refuses(bridge, hf_configs, monkeypatch):
    from megatron.bridge.training.config import runtime_config_update

    from nemo_muon.megatron.bridge.container import config_container

    recipe = _recipe("kimi_k2_muon", hf_configs)
    monkeypatch.setenv("WORLD_SIZE", "3")  # 3 GPUs cannot hold PP4 x EP64
    with target_machine(recipe.system.gpu, TE_VERSION), pytest.raises((ValueError, AssertionError, RuntimeError)):
        runtime_config_update(config_container(recipe))


@pytest.mark.parametrize("name", MEGATRON_RECIPES)
def test_recipe_differs_from_bridges_perf_recipe_only_in_deliberate_fields(name, bridge, hf_configs):
    listed = {f for d in DELIBERATE_DIFFERENCES_06 for f in d.fields}
    assert _differing_fields(name, hf_configs) - listed == set()


def test_every_deliberate_difference_is_one(bridge, hf_configs):
    """No stale row: each field of the table differs for some recipe."""
    differing = set().union(*(_differing_fields(n, hf_configs) for n in MEGATRON_RECIPES))
    stale = [f for d in DELIBERATE_DIFFERENCES_06 for f in d.fields if f not in differing]
    assert stale == []


def test_a_recipe_without_hf_config_builds_from_the_shipped_config(bridge):
    """Was refused ('hf_config must name a local folder holding moonshotai/Kimi-K2-Instruct's ...')."""
    from nemo_muon.megatron.bridge.container import config_container

    recipe = get_recipe("kimi_k2_muon")
    with target_machine(recipe.system.gpu, TE_VERSION):
        container = config_container(recipe)
    assert container.model.hf_model_id == str(SHIPPED_HF_CONFIGS / "kimi_k2") and container.model.num_layers == 61


def test_a_folder_without_config_json_is_refused(bridge, tmp_path):
    from nemo_muon.megatron.bridge.container import config_container

    with pytest.raises(ValueError, match=r"hf_config='.*' must be a folder holding the model's Hugging Face"):
        config_container(build_recipe("qwen3_30b_a3b_muon", [f"hf_config={tmp_path}"]))


def test_the_local_config_is_used_only_while_the_recipe_builds(bridge, hf_configs):
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    from nemo_muon.megatron.bridge.hf_config import local_hf_config

    before = AutoBridge.__dict__["from_hf_pretrained"]
    with local_hf_config(HF_MODEL_IDS["qwen3_30b_a3b"], str(hf_configs["qwen3_30b_a3b"])):
        provider = AutoBridge.from_hf_pretrained("Qwen/Qwen3-30B-A3B", revision="0" * 40).to_megatron_provider(
            load_weights=False)
    assert provider.num_moe_experts == 128 and provider.num_layers == 48
    assert AutoBridge.__dict__["from_hf_pretrained"] is before


def test_an_indexed_corpus_is_the_datasets_blend(bridge, hf_configs):
    """data.kind=indexed reads the recipe's corpus (was: Bridge 0.6's perf recipe's mock data, the path ignored)."""
    from nemo_muon.megatron.bridge.container import config_container

    recipe = _recipe("kimi_k2_adamw", hf_configs, "data.kind=indexed", "data.path=/data/corpus_text_document")
    with target_machine(recipe.system.gpu, TE_VERSION):
        assert config_container(recipe).dataset.blend == (["/data/corpus_text_document"], None)
