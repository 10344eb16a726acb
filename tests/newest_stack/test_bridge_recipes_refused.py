"""NGC 26.04's and 26.06's stacks (Bridge 0.4.2 / 0.5.1, Megatron-Core 0.17.1 / 0.18.2; run in `.venv-ngc-26.04` and
`.venv-ngc-26.06`): engine 'nemo_muon' builds and trains there (test_bridge_provider.py), but those Bridges ship their
perf configs outside the wheel, so a megatron recipe is refused before anything is built, naming the release, the
component and the fix."""

from __future__ import annotations

import importlib.metadata

import pytest
from nemo_muon.recipes import get_recipe

from nemo_muon.megatron.shared.stack import check_recipe_stack
from tests.newest_stack.conftest import stack_release


def test_this_is_a_stack_whose_recipes_are_refused():
    assert stack_release().tag in ("26.04", "26.06")


@pytest.mark.parametrize("name", ["kimi_k2_muon", "qwen3_30b_a3b_adamw"])
def test_megatron_recipes_are_refused_before_launch(name, bridge):
    from nemo_muon.megatron.bridge.container import config_container

    recipe = get_recipe(name).replace(hf_config="/configs/model")
    bridge = importlib.metadata.version("megatron-bridge")
    with pytest.raises(ValueError, match=rf"recipe '{name}' cannot run on the installed stack: megatron-bridge {bridge} "
                                         r"\(NGC 26.0[46]\) ships its perf configs outside the wheel.*fix: use the "
                                         r"nemo:26.08 or nemo:26.02 container"):
        check_recipe_stack(recipe)
    with pytest.raises(ValueError, match=rf"megatron-bridge {bridge} \(NGC 26.0[46]\) ships its perf configs "
                                         r"outside the wheel"):
        config_container(recipe)
    check_recipe_stack(get_recipe("tiny_kimi_k2_muon"))  # the torch backend needs no Bridge recipe
