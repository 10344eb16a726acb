"""Model specs: the derived properties agree with the parameter list, tiny variants keep their family's structure,
bad specs are refused. (The published sizes of Kimi K2 and Qwen3-30B-A3B, which pin the architecture numbers:
tests/test_model_matrices.py.)"""

import re

import pytest

from nemo_muon.models.matrices import is_moe_layer, layer_params
from nemo_muon.models.specs import KIMI_K2, MODEL_SPECS, QWEN3_30B_A3B, TINY_KIMI_K2, TINY_QWEN3_MOE, get_model_spec


def _structure(spec, layer: int) -> set[tuple[str, str]]:
    """(kind, name without layer or expert index) of every parameter of one decoder layer."""
    return {(p.kind, re.sub(r"\.\d+\.", ".N.", p.name)) for p in layer_params(spec, layer)}


@pytest.mark.parametrize("spec", [*MODEL_SPECS.values(), TINY_QWEN3_MOE.replace(name="tiny_dense", num_experts=0)],
                         ids=lambda s: s.name)
def test_derived_properties_agree_with_the_parameter_list(spec):
    moe_layers = [i for i in range(spec.num_layers) if any(p.kind == "expert" for p in layer_params(spec, i))]
    assert spec.num_moe_layers == len(moe_layers)  # Megatron's moe_layer_freq is built from it
    assert moe_layers == [i for i in range(spec.num_layers) if is_moe_layer(spec, i)]
    mla = any("linear_kv_down_proj" in p.name for p in layer_params(spec, 0))
    assert spec.attention == ("mla" if mla else "gqa")


@pytest.mark.parametrize(("tiny", "full"), [(TINY_KIMI_K2, KIMI_K2), (TINY_QWEN3_MOE, QWEN3_30B_A3B)],
                         ids=["kimi_k2", "qwen3_30b_a3b"])
def test_tiny_variant_has_the_parameters_of_its_full_model(tiny, full):
    """Same tensors by name and kind in the first layer and in an MoE layer (MLA with query compression, dense first
    layer, shared experts where the full model has them): the CPU runs exercise the full model's routing."""
    assert tiny.family == full.family
    assert _structure(tiny, 0) == _structure(full, 0)
    assert _structure(tiny, tiny.num_layers - 1) == _structure(full, full.num_layers - 1)


def test_invalid_specs_and_names_are_rejected():
    with pytest.raises(ValueError, match=r"model\[x\].num_attention_heads must be a multiple of num_query_groups \(3\)"):
        QWEN3_30B_A3B.replace(name="x", num_query_groups=3)
    with pytest.raises(ValueError, match=r"model\[x\].moe_top_k must be <= num_experts \(4\); got 8"):
        KIMI_K2.replace(name="x", num_experts=4)
    with pytest.raises(ValueError, match=r"model must be one of .*; got 'gpt5'"):
        get_model_spec("gpt5")
