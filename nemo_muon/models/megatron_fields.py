"""A `ModelSpec` -> the Megatron-Core `TransformerConfig` fields of its architecture (Kimi K2 / Qwen3-MoE families).

The field values are those of Megatron-Bridge 0.3.0's model providers (`KimiK2Provider`; `Qwen3MoEModelProvider`
as `AutoBridge` builds it from the Hub config): the container-stack tests compare this mapping for the full
`KIMI_K2` / `QWEN3_30B_A3B` specs with the real providers field by field, so a tiny spec of the same family gets
the same architecture, shrunk (preflight's tiny model, `nemo_muon.preflight.tiny_model`, and the CPU harness). Torch-free: the caller builds `MLATransformerConfig` (``"mla"``) or
`TransformerConfig` from the kwargs.
"""

from __future__ import annotations

from typing import Any

from nemo_muon.models.specs import ModelSpec

COMMON_FIELDS: dict[str, Any] = {
    "gated_linear_unit": True,  # SwiGLU
    "add_bias_linear": False,
    "normalization": "RMSNorm",
    "layernorm_epsilon": 1e-6,
    "qk_layernorm": True,
    "position_embedding_type": "rope",
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
}
"""Fields both families share (Bridge providers, both)."""
FAMILY_FIELDS: dict[str, dict[str, Any]] = {
    # megatron/bridge/models/kimi/kimi_provider.py (Bridge 0.3.0): DeepseekV3-style sigmoid router with expert bias
    "deepseek_v3": {
        "multi_latent_attention": True,
        "rotary_base": 50000.0,
        "rotary_scaling_factor": 32,
        "moe_router_score_function": "sigmoid",
        "moe_router_enable_expert_bias": True,
        "moe_router_pre_softmax": True,
        "moe_router_topk_scaling_factor": 2.827,
        "moe_router_load_balancing_type": "seq_aux_loss",
        "moe_aux_loss_coeff": 0.001,
        "moe_router_dtype": "fp32",
    },
    # Qwen3MoEModelProvider from the Hub config (qwen_provider.py, qwen3_moe_bridge.py): softmax top-k, aux loss
    "qwen3_moe": {
        "multi_latent_attention": False,
        "rotary_base": 1000000.0,
        "moe_aux_loss_coeff": 0.001,
    },
}
"""Per-family constants that `ModelSpec` does not carry (router and RoPE settings)."""


def config_class(spec: ModelSpec) -> str:
    """'MLATransformerConfig' for MLA models, else 'TransformerConfig'."""
    return "MLATransformerConfig" if spec.attention == "mla" else "TransformerConfig"


def transformer_config_fields(spec: ModelSpec) -> dict[str, Any]:
    """The architecture fields of ``spec`` under Megatron-Core's `TransformerConfig` / `MLATransformerConfig` names."""
    kw: dict[str, Any] = {
        **COMMON_FIELDS,
        **FAMILY_FIELDS[spec.family],
        "num_layers": spec.num_layers,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_attention_heads,
        "ffn_hidden_size": spec.ffn_hidden_size or spec.moe_ffn_hidden_size,
    }
    if spec.attention == "mla":
        kw.update(q_lora_rank=spec.q_lora_rank or None, kv_lora_rank=spec.kv_lora_rank,
                  qk_head_dim=spec.qk_nope_head_dim, qk_pos_emb_head_dim=spec.qk_rope_head_dim,
                  v_head_dim=spec.v_head_dim)
    else:
        kw.update(num_query_groups=spec.num_query_groups, kv_channels=spec.head_dim)
    if spec.num_experts:
        kw.update(num_moe_experts=spec.num_experts, moe_ffn_hidden_size=spec.moe_ffn_hidden_size,
                  moe_router_topk=spec.moe_top_k)
        if spec.num_shared_experts:
            kw["moe_shared_expert_intermediate_size"] = spec.num_shared_experts * spec.moe_ffn_hidden_size
        if spec.num_dense_layers:
            kw["moe_layer_freq"] = [0] * spec.num_dense_layers + [1] * spec.num_moe_layers
    return kw


def model_fields(spec: ModelSpec) -> dict[str, Any]:
    """`GPTModel` arguments that are not config fields: vocabulary and embedding tying."""
    return {"vocab_size": spec.vocab_size, "share_embeddings_and_output_weights": spec.tie_embeddings}
