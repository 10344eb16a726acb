"""Model FLOPs per token: hand-computed small configs, public-config counts of the big models, Bridge's numbers."""

from __future__ import annotations

import pytest

from nemo_muon.accounting.model_flops import model_flops_per_step, model_flops_per_token, padded_vocab_size
from nemo_muon.models.specs import KIMI_K2, QWEN3_30B_A3B, TINY_KIMI_K2, ModelSpec

# A dense GQA model small enough to count by hand.
DENSE_GQA = ModelSpec(name="dense_gqa", family="qwen3_moe", num_layers=2, hidden_size=64, vocab_size=256,
                      num_attention_heads=4, num_query_groups=2, head_dim=16, ffn_hidden_size=128)


def test_dense_gqa_matches_hand_count():
    s = 32
    attn_weights = 64 * 64 + 2 * (32 * 64) + 64 * 64  # q, k, v (2 groups x 16), o
    core = 3 * s * 4 * (16 + 16)  # causal QK^T + AV, fwd + bwd
    mlp = 6 * 3 * 64 * 128  # SwiGLU gate, up, down
    logits = 6 * 64 * 256
    expected = 2 * (6 * attn_weights + core + mlp) + logits
    got = model_flops_per_token(DENSE_GQA, s)
    assert got.total == expected == 565248
    assert got.attention_core == 2 * core and got.logits == logits and got.moe_routed == 0


def test_moe_gqa_counts_top_k_experts_and_no_router():
    spec = DENSE_GQA.replace(name="moe_gqa", num_experts=4, moe_top_k=2, moe_ffn_hidden_size=32)
    s = 32
    per_layer = 6 * (64 * 64 + 2 * 32 * 64 + 64 * 64) + 3 * s * 4 * 32 + 6 * 2 * (3 * 64 * 32)
    got = model_flops_per_token(spec, s)
    assert got.total == 2 * per_layer + 6 * 64 * 256
    assert got.moe_routed == 2 * 6 * 2 * 3 * 64 * 32 and got.dense_mlp == 0
    with_router = model_flops_per_token(spec, s, include_router=True)
    assert with_router.total - got.total == 2 * 6 * 64 * 4


def test_mla_moe_with_dense_first_layer_and_shared_expert_matches_hand_count():
    s = TINY_KIMI_K2  # hidden 128, 4 heads, q_lora 64, kv_lora 32, nope 32, rope 16, v 32; 1 dense + 3 MoE layers
    seq = 64
    attn = 64 * 128 + 4 * 48 * 64 + (32 + 16) * 128 + 4 * (32 + 32) * 32 + 128 * 4 * 32
    attn_total = 6 * (attn + 64 + 32)  # + Megatron's q/kv RMSNorm terms
    core = 3 * seq * 4 * (48 + 32)
    dense = 6 * 3 * 128 * 384
    moe = 6 * (2 * 3 * 128 * 96 + 3 * 128 * 96)  # top-2 routed + 1 shared expert of width 96
    expected = 4 * (attn_total + core) + dense + 3 * moe + 6 * 128 * 4096
    got = model_flops_per_token(s, seq)
    assert got.total == expected
    assert got.moe_shared == 3 * 6 * 3 * 128 * 96


def _independent_kimi_k2(seq: int) -> float:
    # Public config.json of moonshotai/Kimi-K2-Instruct, written out here (not read from ModelSpec).
    h, layers, heads, vocab = 7168, 61, 64, 163840
    q_lora, kv_lora, nope, rope, v = 1536, 512, 128, 64, 128
    attn = q_lora * h + heads * (nope + rope) * q_lora + (kv_lora + rope) * h + heads * (nope + v) * kv_lora \
        + h * heads * v
    dense_mlp = 3 * h * 18432
    moe_mlp = (8 + 1) * 3 * h * 2048  # top-8 routed + 1 shared expert
    linear = layers * attn + 1 * dense_mlp + 60 * moe_mlp + h * vocab
    return 6 * linear + layers * 3 * seq * heads * ((nope + rope) + v)


def _independent_qwen3_30b_a3b(seq: int) -> float:
    # Public config.json of Qwen/Qwen3-30B-A3B.
    h, layers, heads, groups, d, vocab = 2048, 48, 32, 4, 128, 151936
    attn = h * heads * d + 2 * h * groups * d + heads * d * h
    moe_mlp = 8 * 3 * h * 768
    linear = layers * (attn + moe_mlp) + h * vocab
    return 6 * linear + layers * 3 * seq * heads * 2 * d


@pytest.mark.parametrize("spec, independent", [(KIMI_K2, _independent_kimi_k2),
                                               (QWEN3_30B_A3B, _independent_qwen3_30b_a3b)], ids=["kimi", "qwen"])
def test_big_models_match_independent_count(spec, independent):
    assert model_flops_per_token(spec, 4096).total == pytest.approx(independent(4096), rel=0.01)


def test_reproduces_bridge_published_model_tflops():
    # Megatron-Bridge performance summary, 26.02.01, GB300: Kimi K2 256 GPUs 5072 tok/s/GPU -> 1037 TFLOP/s/GPU;
    # Qwen3-30B-A3B 8 GPUs 30411 tok/s/GPU -> 700 TFLOP/s/GPU (both seq 4096).
    assert model_flops_per_token(KIMI_K2, 4096).total * 5072 / 1e12 == pytest.approx(1037, abs=1)
    assert model_flops_per_token(QWEN3_30B_A3B, 4096).total * 30411 / 1e12 == pytest.approx(700, abs=1)
    assert model_flops_per_step(KIMI_K2, 4096, 4096) == pytest.approx(3.4306e18, rel=1e-4)


def test_recompute_adds_hardware_flops_only():
    base = model_flops_per_token(KIMI_K2, 4096)
    full = model_flops_per_token(KIMI_K2, 4096, recompute_granularity="full")
    up = model_flops_per_token(KIMI_K2, 4096, recompute_granularity="selective", recompute_modules=("mla_up_proj",))
    core = model_flops_per_token(KIMI_K2, 4096, recompute_granularity="selective")
    assert full.total == up.total == core.total == base.total and base.recompute == 0
    assert full.recompute == pytest.approx((base.total - base.logits) / 3)
    assert up.recompute == 2 * 61 * (64 * 192 * 1536 + 64 * 256 * 512)  # forward of q_up and kv_up again
    assert core.recompute == pytest.approx(base.attention_core / 3)
    assert full.hardware_total > up.hardware_total > base.hardware_total


def test_bad_inputs_name_the_field():
    with pytest.raises(ValueError, match="recompute_modules must be one of .*got 'attn'"):
        model_flops_per_token(KIMI_K2, 4096, recompute_granularity="selective", recompute_modules=("attn",))
    with pytest.raises(ValueError, match="recompute_granularity must be one of"):
        model_flops_per_token(KIMI_K2, 4096, recompute_granularity="some")
    with pytest.raises(ValueError, match="mla_up_proj"):
        model_flops_per_token(QWEN3_30B_A3B, 4096, recompute_granularity="selective",
                              recompute_modules=("mla_up_proj",))
    with pytest.raises(ValueError, match="seq_length must be an integer >= 1; got 0"):
        model_flops_per_token(KIMI_K2, 0)


def test_vocab_padding_follows_megatron():
    assert padded_vocab_size(163840, 1) == 163840
    assert padded_vocab_size(151936, 8) == 152576  # multiple of 128 * 8
    assert model_flops_per_token(DENSE_GQA.replace(vocab_size=200), 32).logits == 6 * 64 * 256
