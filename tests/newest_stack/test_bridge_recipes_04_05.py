"""NGC 26.04's and 26.06's stacks (Bridge 0.4.2 / 0.5.1, Megatron-Core 0.17.1 / 0.18.2; run in `.venv-ngc-26.04` and
`.venv-ngc-26.06`): every megatron recipe builds its real `ConfigContainer` from the library recipe of the wheel, its
model read offline from the config.json nemo-muon ships (no ``hf_config``), passes what Bridge's `pretrain()` runs on it
first (`runtime_config_update`) at its world size on its target GPU, and differs from that release's own perf run
(recorded from ``scripts/performance/`` at the tag, tests/newest_stack/perf_runs.py) only in the fields of the
release's deliberate differences, each of which differs for some recipe."""

from __future__ import annotations

import ast
import json
import math
import shutil

import pytest
from nemo_muon.recipes import get_recipe, list_recipes
from nemo_muon.recipes.execute import build_recipe

from nemo_muon.megatron.bridge.hf_config import SHIPPED_HF_CONFIGS
from nemo_muon.megatron.bridge_04_05.library_recipe import DELIBERATE_DIFFERENCES
from nemo_muon.megatron.shared.stack import check_recipe_stack
from tests.megatron_cpu.bridge_validation import target_machine
from tests.newest_stack.conftest import stack_release
from tests.newest_stack.perf_runs import flat, installed_minor, perf_run_fields, recording_path, run_key

MEGATRON_RECIPES = [n for n in list_recipes() if get_recipe(n).backend == "megatron"]


@pytest.fixture(scope="module")
def recipes_importable(bridge) -> None:
    """Bridge's library recipes import here (their package's diffusion recipes answered without TE)."""
    from tests.megatron_cpu.te_stub import bridge_recipes_import_without_te

    bridge_recipes_import_without_te()


def _same(ours: str, bridge: str) -> bool:
    """Equal reprs, or equal numbers (100 and 100.0; a rounded product), or equal sequences (a tuple and the list
    Bridge's Hydra round trip makes of it)."""
    if ours == bridge:
        return True
    try:
        a, b = ast.literal_eval(ours), ast.literal_eval(bridge)
    except (ValueError, SyntaxError):
        return False
    if isinstance(a, int | float) and isinstance(b, int | float) and not isinstance(a, bool) | isinstance(b, bool):
        return math.isclose(a, b, rel_tol=1e-12)
    return isinstance(a, list | tuple) and isinstance(b, list | tuple) and list(a) == list(b)


def test_this_is_a_bridge_04_or_05_stack():
    assert stack_release().tag in ("26.04", "26.06")


def test_every_megatron_recipe_builds_validates_and_differs_from_the_releases_perf_run_only_where_documented(
        recipes_importable, monkeypatch):
    from megatron.bridge.training.config import runtime_config_update

    from nemo_muon.megatron.bridge.container import config_container

    te = stack_release().transformer_engine
    recording = json.loads(recording_path(installed_minor()).read_text())
    rows = DELIBERATE_DIFFERENCES[installed_minor()]
    listed = {f for row in rows for f in row.fields}
    differing: set[str] = set()
    for name in MEGATRON_RECIPES:
        recipe = get_recipe(name)
        assert recipe.hf_config is None  # offline by default: the shipped config.json
        check_recipe_stack(recipe)  # what --dryrun / plan / launch ask first
        monkeypatch.setenv("WORLD_SIZE", str(recipe.system.world_size))
        for variable, value in recipe.env.items():  # runtime_config_update sets env defaults: keep them in the test
            monkeypatch.setenv(variable, value)
        with target_machine(recipe.system.gpu, te):
            ours = flat(config_container(recipe))
            bridge = perf_run_fields(recipe, recording)
            container = config_container(recipe)
            runtime_config_update(container)
        par = recipe.parallelism
        assert (container.model.tensor_model_parallel_size, container.model.pipeline_model_parallel_size,
                container.model.expert_model_parallel_size) == (par.tp, par.pp, par.ep), name
        assert container.data_parallel_size == recipe.system.world_size // (par.tp * par.pp * par.cp), name
        assert (container.model.num_layers, container.model.num_moe_experts) == (
            recipe.model.num_layers, recipe.model.num_experts), name
        assert container.optimizer.weight_decay == container.scheduler.end_weight_decay == recipe.optimizer.weight_decay
        differ = {k for k in ours.keys() | bridge.keys() if not _same(ours.get(k, "<absent>"), bridge.get(k, "<absent>"))}
        assert differ <= listed, f"{name} ({run_key(recipe)}) differs from Bridge's perf run, undocumented: " + ", ".join(
            f"{k}: Bridge {bridge.get(k, '<absent>')}, ours {ours.get(k, '<absent>')}" for k in sorted(differ - listed))
        differing |= differ
    stale = [f for row in rows for f in row.fields if f not in differing]
    assert stale == [], f"deliberate differences that no recipe has: {stale}"


def test_validation_is_real_it_refuses_what_bridge_refuses(recipes_importable, monkeypatch):
    from megatron.bridge.training.config import runtime_config_update

    from nemo_muon.megatron.bridge.container import config_container

    recipe = get_recipe("kimi_k2_muon")
    monkeypatch.setenv("WORLD_SIZE", "3")  # 3 GPUs cannot hold PP4 x EP64
    with target_machine(recipe.system.gpu, stack_release().transformer_engine), \
            pytest.raises((ValueError, AssertionError, RuntimeError)):
        runtime_config_update(config_container(recipe))


def test_hf_config_names_another_local_copy_and_a_folder_without_one_is_refused(recipes_importable, tmp_path):
    from nemo_muon.megatron.bridge.container import config_container

    copy = tmp_path / "qwen"
    copy.mkdir()
    shutil.copyfile(SHIPPED_HF_CONFIGS / "qwen3_30b_a3b" / "config.json", copy / "config.json")
    recipe = build_recipe("qwen3_30b_a3b_muon", [f"hf_config={copy}"])
    with target_machine(recipe.system.gpu, stack_release().transformer_engine):
        assert config_container(recipe).model.hf_model_id == str(copy)
        with pytest.raises(ValueError, match=r"hf_config='.*' must be a folder holding the model's Hugging Face"):
            config_container(build_recipe("qwen3_30b_a3b_muon", [f"hf_config={tmp_path}"]))


def test_a_system_without_a_perf_workload_of_the_release_is_refused_naming_those_it_has(recipes_importable):
    from nemo_muon.megatron.bridge.container import config_container

    recipe = get_recipe("qwen3_30b_a3b_adamw_h100").replace(precision=get_recipe("qwen3_30b_a3b_adamw_bf16").precision)
    recipe = recipe.replace(system=get_recipe("kimi_k2_adamw").system.__class__(gpu="h200", gpus_per_node=8,
                                                                               num_nodes=2))
    with pytest.raises(ValueError, match=r"Megatron-Bridge 0\.[45] perf workloads.*got \('qwen3_30b_a3b', 'h200'\)"):
        config_container(recipe)


def test_an_indexed_corpus_is_the_datasets_blend(recipes_importable):
    """data.kind=indexed reads the recipe's corpus (the library recipe of Bridge >= 0.4 takes no data argument)."""
    from nemo_muon.megatron.bridge.container import config_container

    recipe = build_recipe("qwen3_30b_a3b_muon", ["data.kind=indexed", "data.path=/data/corpus_text_document"])
    with target_machine(recipe.system.gpu, stack_release().transformer_engine):
        dataset = config_container(recipe).dataset
    assert (dataset.blend, dataset.split) == ((["/data/corpus_text_document"], None), "9999,8,2")
