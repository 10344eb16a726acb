"""The parameter list of a ModelSpec: public parameter counts, shapes, names and the split/fused views."""

from __future__ import annotations

import pytest

from nemo_muon.models.matrices import (
    KINDS,
    active_params,
    is_moe_layer,
    layer_params,
    matrix_params,
    total_params,
)
from nemo_muon.models.specs import KIMI_K2, QWEN3_30B_A3B, TINY_KIMI_K2, TINY_QWEN3_MOE


def test_kimi_k2_matches_public_parameter_counts():
    # Kimi K2 tech report: 1.04T total, 32B activated (HF card: "1T" / "32B").
    params = matrix_params(KIMI_K2)
    assert total_params(params) == pytest.approx(1.04e12, rel=0.02)
    assert active_params(KIMI_K2, params) == pytest.approx(32e9, rel=0.05)


def test_qwen3_30b_a3b_matches_public_parameter_counts():
    # HF model card: 30.5B total, 3.3B activated, 29.9B non-embedding.
    params = matrix_params(QWEN3_30B_A3B)
    assert total_params(params) == pytest.approx(30.5e9, rel=0.005)
    assert active_params(QWEN3_30B_A3B, params) == pytest.approx(3.3e9, rel=0.02)
    non_embedding = total_params(p for p in params if p.kind not in ("embedding", "head"))
    assert non_embedding == pytest.approx(29.9e9, rel=0.005)


@pytest.mark.parametrize("spec", [TINY_KIMI_K2, TINY_QWEN3_MOE, TINY_KIMI_K2.replace(name="tiny_kimi_no_qlora", q_lora_rank=0)],
                         ids=lambda s: s.name)
def test_split_and_fused_views_hold_the_same_parameters(spec):
    split = matrix_params(spec, split_gate_up=True, split_qkv=True)
    fused = matrix_params(spec, split_gate_up=False, split_qkv=False)
    assert total_params(split) == total_params(fused)
    assert {p.tensor_name for p in split} == {p.name for p in fused}
    assert len({p.name for p in split}) == len(split)  # names are unique


def test_tiny_kimi_layer_shapes_follow_mla_and_moe_layout():
    s = TINY_KIMI_K2  # hidden 128, 4 heads, q_lora 64, kv_lora 32, nope 32, rope 16, v 32, 8 experts of 96, 1 shared
    dense = {p.name: p for p in layer_params(s, 0)}
    assert dense["decoder.layers.0.self_attention.linear_q_down_proj.weight"].shape == (64, 128)
    assert dense["decoder.layers.0.self_attention.linear_q_up_proj.weight"].shape == (4 * 48, 64)
    assert dense["decoder.layers.0.self_attention.linear_kv_down_proj.weight"].shape == (32 + 16, 128)
    assert dense["decoder.layers.0.self_attention.linear_kv_up_proj.weight"].shape == (4 * 64, 32)
    assert dense["decoder.layers.0.self_attention.linear_proj.weight"].shape == (128, 4 * 32)
    assert dense["decoder.layers.0.mlp.linear_fc1.weight[gate]"].shape == (384, 128)
    assert dense["decoder.layers.0.mlp.linear_fc2.weight"].kind == "dense_mlp"
    assert not is_moe_layer(s, 0) and is_moe_layer(s, 1)
    moe = layer_params(s, 1, split_gate_up=False)
    experts = [p for p in moe if p.kind == "expert"]
    assert sorted({p.expert for p in experts}) == list(range(8))
    assert {p.shape for p in experts} == {(192, 128), (128, 96)}
    assert [p.shape for p in moe if p.kind == "router"] == [(8, 128)]
    assert {p.shape for p in moe if p.kind == "shared_expert"} == {(192, 128), (128, 96)}


def test_qwen_qkv_split_shapes_and_kinds():
    s = TINY_QWEN3_MOE  # 4 heads, 2 groups, head_dim 32
    by_name = {p.name: p for p in layer_params(s, 2)}
    assert by_name["decoder.layers.2.self_attention.linear_qkv.weight[q]"].shape == (128, 128)
    assert by_name["decoder.layers.2.self_attention.linear_qkv.weight[k]"].shape == (64, 128)
    fused = {p.name: p for p in layer_params(s, 2, split_qkv=False)}
    assert fused["decoder.layers.2.self_attention.linear_qkv.weight"].shape == (256, 128)
    assert all(p.kind in KINDS for p in matrix_params(s))
    assert not any(p.kind == "shared_expert" for p in matrix_params(s))


def test_hidden_matrices_exclude_embedding_head_and_norms():
    params = matrix_params(TINY_QWEN3_MOE)
    hidden = [p for p in params if p.is_hidden_matrix]
    assert all(len(p.shape) == 2 and p.kind not in ("embedding", "head", "norm") for p in hidden)
    assert {p.kind for p in params if not p.is_hidden_matrix} == {"embedding", "head", "norm"}
    assert params[0].name == "embedding.word_embeddings.weight" and params[-1].name == "output_layer.weight"


def test_tied_embeddings_drop_the_head_and_bad_layer_is_named():
    tied = TINY_QWEN3_MOE.replace(tie_embeddings=True)
    assert not any(p.kind == "head" for p in matrix_params(tied))
    with pytest.raises(ValueError, match=r"layer must be in \[0, 4\).*got 4"):
        layer_params(tied, 4)
