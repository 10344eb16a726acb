"""ModelSpec -> HF transformers models: the architecture numbers arrive intact, builds are seeded."""

import pytest
import torch

from nemo_muon.models.hf import build_model, count_parameters, hf_config
from nemo_muon.models.matrices import matrix_params, total_params
from nemo_muon.models.specs import TINY_KIMI_K2, TINY_QWEN3_MOE


def test_deepseek_config_carries_kimi_k2_architecture():
    c = hf_config(TINY_KIMI_K2)
    assert c.model_type == "deepseek_v3"
    assert (c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim) == (
        TINY_KIMI_K2.q_lora_rank, TINY_KIMI_K2.kv_lora_rank, TINY_KIMI_K2.qk_nope_head_dim,
        TINY_KIMI_K2.qk_rope_head_dim, TINY_KIMI_K2.v_head_dim)
    assert c.first_k_dense_replace == TINY_KIMI_K2.num_dense_layers == 1
    assert c.n_routed_experts == TINY_KIMI_K2.num_experts and c.n_shared_experts == 1
    assert c.num_experts_per_tok == TINY_KIMI_K2.moe_top_k


@pytest.mark.parametrize("spec", [TINY_KIMI_K2, TINY_QWEN3_MOE], ids=lambda s: s.name)
def test_parameter_count_matches_accounting(spec):
    """The HF model has exactly the parameters the torch-free accounting lists for the spec."""
    model = build_model(spec, seed=0)
    assert count_parameters(model) == total_params(matrix_params(spec, split_gate_up=False, split_qkv=False))


def test_experts_are_3d_stacks_with_fused_gate_up():
    model = build_model(TINY_KIMI_K2, seed=0)
    shapes = dict((n, tuple(p.shape)) for n, p in model.named_parameters())
    s = TINY_KIMI_K2
    assert shapes["model.layers.1.mlp.experts.gate_up_proj"] == (s.num_experts, 2 * s.moe_ffn_hidden_size, s.hidden_size)
    assert shapes["model.layers.1.mlp.experts.down_proj"] == (s.num_experts, s.hidden_size, s.moe_ffn_hidden_size)
    assert "model.layers.0.mlp.gate_proj.weight" in shapes  # the dense first layer


def test_build_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(7)
    before = torch.rand(1)
    torch.manual_seed(7)
    a = build_model(TINY_QWEN3_MOE, seed=3)
    after = torch.rand(1)
    b = build_model(TINY_QWEN3_MOE, seed=3)
    c = build_model(TINY_QWEN3_MOE, seed=4)
    assert torch.equal(before, after)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.embed_tokens.weight"], sc["model.embed_tokens.weight"])


def test_qwen3_with_shared_expert_is_rejected():
    with pytest.raises(ValueError, match=r"num_shared_experts must be 0 for family 'qwen3_moe'.*got 1"):
        hf_config(TINY_QWEN3_MOE.replace(num_shared_experts=1))
