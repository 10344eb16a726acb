"""Routing by what a parameter is (issue 37 item 1) on HF ``transformers`` models built offline from tiny configs:
GPT-2 (tied head, position embedding, Conv1D stored (in, out), fused ``c_attn``), Llama (untied head), Qwen3-MoE and
DeepseekV3 (3-D expert stacks with fused gate/up): ``Muon(model)`` agrees with the documented name rule where names are
known, and splits what the names alone cannot."""

from __future__ import annotations

import functools
import math
import warnings

import pytest
import torch
from torch import nn

from nemo_muon.optim.muon import Muon
from nemo_muon.optim.ns_iteration import newton_schulz
from nemo_muon.optim.routing import ADAMW, MATRIX, GateUpLayout, QKVLayout

DIM = 32


@functools.cache
def _config(family: str):  # noqa: ANN202 - a transformers config
    import transformers as tf

    if family == "gpt2":
        return tf.GPT2Config(vocab_size=64, n_positions=16, n_embd=DIM, n_layer=2, n_head=4, bos_token_id=0,
                             eos_token_id=0)
    if family == "llama":
        return tf.LlamaConfig(vocab_size=64, hidden_size=DIM, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    if family == "qwen3_moe":
        return tf.Qwen3MoeConfig(vocab_size=64, hidden_size=DIM, intermediate_size=48, moe_intermediate_size=16,
                                 num_hidden_layers=2, num_experts=4, num_experts_per_tok=2, num_attention_heads=4,
                                 num_key_value_heads=2, head_dim=8)
    return tf.DeepseekV3Config(vocab_size=64, hidden_size=DIM, intermediate_size=48, moe_intermediate_size=16,
                               num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
                               n_shared_experts=1, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16,
                               kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4, n_group=1,
                               topk_group=1)


def _model(family: str) -> nn.Module:
    import transformers as tf

    classes = {"gpt2": tf.GPT2LMHeadModel, "llama": tf.LlamaForCausalLM, "qwen3_moe": tf.Qwen3MoeForCausalLM,
               "deepseek_v3": tf.DeepseekV3ForCausalLM}
    torch.manual_seed(0)
    return classes[family](_config(family))


def _routes(opt: torch.optim.Optimizer, model: nn.Module) -> dict[str, tuple[str, str | None, bool]]:
    out = {}
    for name, p in model.named_parameters():
        r = opt.route_of(p)
        out[name] = (r.algorithm, type(r.layout).__name__ if r.layout else None, r.transposed)
    return out


def _quiet_module_routes(model: nn.Module) -> tuple[Muon, dict]:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing unsure on a known model
        opt = Muon(model, lr=1e-2)
    return opt, _routes(opt, model)


def test_gpt2_tied_head_positions_and_fused_c_attn() -> None:
    model = _model("gpt2")
    opt, routes = _quiet_module_routes(model)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert routes["transformer.wte.weight"] == (ADAMW, None, False)
    assert routes["transformer.wpe.weight"] == (ADAMW, None, False)
    assert routes["transformer.h.0.ln_1.weight"][0] == routes["transformer.h.0.attn.c_attn.bias"][0] == ADAMW
    assert routes["transformer.h.0.attn.c_attn.weight"] == (MATRIX, "QKVLayout", True)
    assert routes["transformer.h.1.mlp.c_fc.weight"] == (MATRIX, None, True)
    reason = {r.name: r.reason for r in opt.routes()}["transformer.wte.weight"]
    assert "output head 'lm_head' (get_output_embeddings())" in reason and "tied to embedding 'transformer.wte'" in reason


def test_gpt2_conv1d_updates_are_muon_on_the_stored_transpose() -> None:
    """c_attn (in, 3·out) = [q | k | v] on the columns: each block gets Muon of its (out, in) matrix, transposed back;
    c_fc (in, out) with shape_scaling takes sqrt(out / in) as a Linear of the same map would."""
    model = _model("gpt2")
    attn, fc = model.transformer.h[0].attn.c_attn.weight, model.transformer.h[0].mlp.c_fc.weight
    grads = {attn: torch.randn_like(attn), fc: torch.randn_like(fc)}
    before = {p: p.detach().clone() for p in grads}
    opt = Muon(model, lr=0.1, weight_decay=0.0, momentum=0.0, nesterov=False, scale_mode="shape_scaling")
    for p, g in grads.items():
        p.grad = g
    opt.step()
    expected = torch.cat([(before[attn][:, i * DIM:(i + 1) * DIM].T - 0.1 * newton_schulz(g.T)).T
                          for i, g in enumerate(grads[attn].split(DIM, dim=1))], dim=1)  # square parts: scale 1
    assert torch.allclose(attn.detach(), expected, atol=1e-5)
    out, in_ = fc.shape[1], fc.shape[0]
    assert torch.allclose(fc.detach(), before[fc] - 0.1 * math.sqrt(out / in_) * newton_schulz(grads[fc].T).T,
                          atol=1e-5)


def test_llama_untied_head_and_norms() -> None:
    model = _model("llama")
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    opt, routes = _quiet_module_routes(model)
    assert routes["model.embed_tokens.weight"][0] == routes["lm_head.weight"][0] == ADAMW
    assert routes["model.norm.weight"][0] == routes["model.layers.0.input_layernorm.weight"][0] == ADAMW
    for proj in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                 "mlp.up_proj", "mlp.down_proj"):
        assert routes[f"model.layers.1.{proj}.weight"] == (MATRIX, None, False), proj
    reasons = {r.name: r.reason for r in opt.routes()}
    assert reasons["lm_head.weight"] == "output head 'lm_head' (get_output_embeddings())"
    assert reasons["model.norm.weight"] == "norm (LlamaRMSNorm 'model.norm')"


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3"])
def test_moe_models_route_as_the_name_rule_with_gate_up_split(family: str) -> None:
    """On models whose names the rule knows, the module routes exactly as the names do (no warning either way)."""
    model = _model(family)
    opt, by_module = _quiet_module_routes(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        by_name = _routes(Muon(model.named_parameters(), lr=1e-2), model)
    assert by_module == by_name
    assert by_module["model.layers.1.mlp.experts.gate_up_proj"] == (MATRIX, "GateUpLayout", False)
    assert by_module["model.layers.1.mlp.experts.down_proj"] == (MATRIX, None, False)
    assert by_module["model.layers.1.mlp.gate.weight"] == (MATRIX, None, False)  # the router: a hidden matrix
    assert by_module["lm_head.weight"][0] == by_module["model.embed_tokens.weight"][0] == ADAMW
    row = next(r for r in opt.routes() if r.name == "model.layers.1.mlp.experts.gate_up_proj")
    assert row.update == "Muon per expert, gate, up apart" and "by name segment 'gate_up_proj'" in row.reason
    assert isinstance(opt.route_of(model.model.layers[1].mlp.experts.gate_up_proj).layout, GateUpLayout)


def test_gpt2_by_name_alone_keeps_c_attn_whole() -> None:
    """Names cannot tell GPT-2's Conv1D storage or its fused c_attn: the documented limit of the name rule, which the
    module removes."""
    model = _model("gpt2")
    by_name = _routes(Muon(model.named_parameters(), lr=1e-2), model)
    assert by_name["transformer.h.0.attn.c_attn.weight"] == (MATRIX, None, False)
    assert _routes(Muon(model, lr=1e-2), model)["transformer.h.0.attn.c_attn.weight"] == (MATRIX, "QKVLayout", True)
    assert Muon(model, lr=1e-2, split_qkv=False).route_of(
        model.transformer.h[0].attn.c_attn.weight).layout is None
    assert QKVLayout(1, 1, DIM).group_shapes() == [DIM, DIM, DIM]
