"""The routing rule on real tiny HF models (DeepseekV3 = Kimi K2's architecture, Qwen3-MoE), fused layouts, overrides,
and parameters the rule cannot place."""

from __future__ import annotations

import functools

import pytest
import torch

from nemo_muon.optim.fused import merge_parts, split_parts
from nemo_muon.optim.muon import Muon
from nemo_muon.optim.routing import ADAMW, MATRIX, GateUpLayout, QKVLayout, default_matrix_rule, route_param


@functools.cache
def _deepseek() -> torch.nn.Module:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
        first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=8, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=4, n_group=1, topk_group=1,
    )
    return DeepseekV3ForCausalLM(cfg)


@functools.cache
def _qwen3_moe() -> torch.nn.Module:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    cfg = Qwen3MoeConfig(vocab_size=64, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                         num_hidden_layers=2, num_experts=4, num_experts_per_tok=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=8)
    return Qwen3MoeForCausalLM(cfg)


def _routes(model: torch.nn.Module) -> dict[str, tuple[str, str | None]]:
    opt = Muon(model.named_parameters(), lr=1e-3)
    out = {}
    for name, p in model.named_parameters():
        r = opt.route_of(p)
        out[name] = (r.algorithm, type(r.layout).__name__ if r.layout else None)
    return out


def test_deepseek_v3_routing() -> None:
    routes = _routes(_deepseek())
    assert routes["model.embed_tokens.weight"] == (ADAMW, None)
    assert routes["lm_head.weight"] == (ADAMW, None)
    assert routes["model.norm.weight"] == (ADAMW, None)
    assert routes["model.layers.0.self_attn.q_a_layernorm.weight"] == (ADAMW, None)
    for mla in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj"):  # each its own matrix
        assert routes[f"model.layers.1.self_attn.{mla}.weight"] == (MATRIX, None), mla
    assert routes["model.layers.0.mlp.gate_proj.weight"] == (MATRIX, None)  # dense layer: separate gate / up
    assert routes["model.layers.1.mlp.experts.gate_up_proj"] == (MATRIX, "GateUpLayout")  # (E, 2I, H)
    assert routes["model.layers.1.mlp.experts.down_proj"] == (MATRIX, None)
    assert routes["model.layers.1.mlp.shared_experts.up_proj.weight"] == (MATRIX, None)
    assert routes["model.layers.1.mlp.gate.weight"] == (MATRIX, None)  # router: a 2-D hidden matrix
    assert {a for a, _ in routes.values()} == {ADAMW, MATRIX}


def test_qwen3_moe_routing() -> None:
    routes = _routes(_qwen3_moe())
    assert routes["model.embed_tokens.weight"] == (ADAMW, None)
    assert routes["lm_head.weight"] == (ADAMW, None)
    assert routes["model.layers.0.self_attn.q_norm.weight"] == (ADAMW, None)
    for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
        assert routes[f"model.layers.0.self_attn.{proj}.weight"] == (MATRIX, None)
    assert routes["model.layers.1.mlp.experts.gate_up_proj"] == (MATRIX, "GateUpLayout")


def test_hf_expert_gate_up_layout_is_gate_then_up() -> None:
    """transformers 5.x computes gate, up = linear(x, gate_up_proj[e]).chunk(2, dim=-1): gate = first half of dim 1."""
    experts = _qwen3_moe().model.layers[0].mlp.experts
    e, two_i, h = experts.gate_up_proj.shape
    assert two_i == 2 * experts.intermediate_dim and h == experts.hidden_dim
    x = torch.randn(3, h)
    gate, up = torch.nn.functional.linear(x, experts.gate_up_proj[1]).chunk(2, dim=-1)
    route = route_param("mlp.experts.gate_up_proj", (e, two_i, h))
    g_part, u_part = split_parts(experts.gate_up_proj.detach(), route, "gate_up_proj")
    assert torch.allclose(gate, x @ g_part[1].T) and torch.allclose(up, x @ u_part[1].T)


def test_muon_step_on_hf_moe_model_updates_every_param() -> None:
    torch.manual_seed(0)
    model = _qwen3_moe()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = Muon(model.named_parameters(), lr=1e-2, weight_decay=0.0, scale_mode="spectral")
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    for n, p in model.named_parameters():
        assert not torch.equal(before[n], p.detach()), n
    # an expert stack gets one orthogonalized update per expert and per gate/up half
    stack = dict(model.named_parameters())["model.layers.0.mlp.experts.gate_up_proj"]
    delta = (before["model.layers.0.mlp.experts.gate_up_proj"] - stack.detach()) / 1e-2
    for half in delta.chunk(2, dim=1):
        for e in range(half.shape[0]):
            s = torch.linalg.svdvals(half[e])
            scale = max(half.shape[-2:]) ** 0.5
            assert 0.95 * scale < s.min() and s.max() < 1.05 * scale


def test_qkv_split_per_query_group_roundtrip() -> None:
    layout = QKVLayout(num_attention_heads=4, num_query_groups=2, head_dim=3)
    route = route_param("decoder.layers.0.self_attention.linear_qkv.weight", (2 * (2 * 3 + 3 + 3), 5),
                        layouts={"linear_qkv": layout})
    w = torch.arange(24 * 5, dtype=torch.float32).reshape(24, 5)
    q, k, v = split_parts(w, route, "linear_qkv")
    assert q.shape == (12, 5) and k.shape == (6, 5) and v.shape == (6, 5)
    assert torch.equal(q[:6], w[:6]) and torch.equal(k[:3], w[6:9]) and torch.equal(v[3:], w[21:24])
    assert torch.equal(merge_parts([q, k, v], route, w), w)


def test_layout_spec_dicts_and_disabling() -> None:
    spec = {"linear_qkv": {"kind": "qkv", "num_attention_heads": 4, "num_query_groups": 2, "head_dim": 3},
            "linear_fc1": None}
    params = [("a.linear_qkv.weight", torch.nn.Parameter(torch.randn(24, 5))),
              ("a.linear_fc1.weight", torch.nn.Parameter(torch.randn(8, 5)))]
    opt = Muon(params, lr=1e-3, fused_layouts=spec)
    assert isinstance(opt.route_of(params[0][1]).layout, QKVLayout)
    assert opt.route_of(params[1][1]).layout is None
    no_split = Muon(params[1:], lr=1e-3, split_gate_up=False)
    assert no_split.route_of(params[1][1]).layout is None
    assert isinstance(Muon(params[1:], lr=1e-3).route_of(params[1][1]).layout, GateUpLayout)


def test_overrides_and_plain_tensors() -> None:
    emb = torch.nn.Parameter(torch.randn(10, 4))
    w = torch.nn.Parameter(torch.randn(4, 4))
    with pytest.raises(ValueError, match=r"parameter 'param_groups\[0\]\.params\[0\]' with shape \(10, 4\) has no "
                       r"name.*pass the model itself \(Muon\(model, \.\.\.\)\) or model\.named_parameters\(\)"):
        Muon([emb, w], lr=1e-3)  # plain tensors (model.parameters()): refused with the fix
    opt = Muon([{"params": [emb], "algorithm": "adamw"}, {"params": [w], "algorithm": "matrix"}], lr=1e-3)
    assert opt.route_of(emb).algorithm == ADAMW and opt.route_of(w).algorithm == MATRIX
    opt = Muon([("x.router.weight", w)], lr=1e-3, matrix_rule=lambda n, s: "adamw" if "router" in n else None)
    assert opt.route_of(w).algorithm == ADAMW
    assert default_matrix_rule("decoder.layers.0.mlp.linear_fc2.weight", (4, 8)) == MATRIX
    assert default_matrix_rule("embedding.word_embeddings.weight", (100, 8)) == ADAMW
    assert default_matrix_rule("output_layer.weight", (100, 8)) == ADAMW


@pytest.mark.parametrize(
    ("params", "kwargs", "message"),
    [
        ([("conv.weight", torch.randn(2, 3, 4, 4))], {}, "'conv.weight' with shape .* cannot be placed"),
        ([("a.linear_qkv.weight", torch.randn(24, 5))], {}, "'a.linear_qkv.weight' is a fused QKV weight"),
        ([("a.linear_fc1.weight", torch.randn(7, 5))], {}, "'a.linear_fc1.weight' must have an even output dim"),
        ([("w", torch.randn(4, 4))], {"matrix_rule": lambda n, s: "sgd"}, "routing of parameter 'w' must be one of"),
        ([("b", torch.randn(4))], {"matrix_rule": lambda n, s: "matrix"}, "'b' with shape .* cannot take the matrix"),
        ([("a.linear_qkv.weight", torch.randn(25, 5))],
         {"fused_layouts": {"linear_qkv": QKVLayout(4, 2, 3)}}, "25 rows, not a multiple"),
        ([("w", torch.randn(4, 4))], {"fused_layouts": {"w": "gate_up"}}, r"fused_layouts\['w'\] must be"),
    ],
)
def test_unplaceable_params_raise_naming_them(params: list, kwargs: dict, message: str) -> None:
    named = [(n, torch.nn.Parameter(t)) for n, t in params]
    with pytest.raises(ValueError, match=message):
        Muon(named, lr=1e-3, **kwargs)


def test_bad_group_algorithm_and_qkv_layout() -> None:
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['algorithm'\] must be one of"):
        Muon([{"params": [torch.nn.Parameter(torch.randn(3, 3))], "algorithm": "muon"}], lr=1e-3)
    with pytest.raises(ValueError, match="num_query_groups must divide"):
        QKVLayout(num_attention_heads=5, num_query_groups=2, head_dim=4)
