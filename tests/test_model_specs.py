"""Model specs: the public architecture numbers, written once, validated."""

import pytest

from nemo_muon.models.specs import KIMI_K2, QWEN3_30B_A3B, TINY_KIMI_K2, get_model_spec


def test_kimi_k2_is_deepseek_v3_with_mla_and_one_dense_layer():
    assert KIMI_K2.attention == "mla"
    assert (KIMI_K2.num_layers, KIMI_K2.num_dense_layers, KIMI_K2.num_moe_layers) == (61, 1, 60)
    assert (KIMI_K2.num_experts, KIMI_K2.moe_top_k, KIMI_K2.num_shared_experts) == (384, 8, 1)


def test_qwen3_30b_a3b_is_gqa_moe():
    assert QWEN3_30B_A3B.attention == "gqa"
    assert QWEN3_30B_A3B.num_moe_layers == 48
    assert QWEN3_30B_A3B.num_attention_heads // QWEN3_30B_A3B.num_query_groups == 8


def test_tiny_variant_keeps_the_family():
    assert TINY_KIMI_K2.family == KIMI_K2.family
    assert TINY_KIMI_K2.num_dense_layers >= 1 and TINY_KIMI_K2.num_shared_experts >= 1


def test_invalid_specs_and_names_are_rejected():
    with pytest.raises(ValueError, match=r"model\[x\].num_attention_heads must be a multiple of num_query_groups \(3\)"):
        QWEN3_30B_A3B.replace(name="x", num_query_groups=3)
    with pytest.raises(ValueError, match=r"model\[x\].moe_top_k must be <= num_experts \(4\); got 8"):
        KIMI_K2.replace(name="x", num_experts=4)
    with pytest.raises(ValueError, match=r"model must be one of .*; got 'gpt5'"):
        get_model_spec("gpt5")
