"""ModelSpec -> HF `transformers` config and model (DeepseekV3 = Kimi K2's architecture, Qwen3-MoE).

The torch backend trains these models; every architecture number comes from the `ModelSpec` (nothing is copied
here). Knobs a ModelSpec does not carry (router grouping, initializer range, norm epsilon) take the values below,
chosen for tiny CPU models and documented next to them. Expert weights of both families are 3-D stacks
(`mlp.experts.gate_up_proj` = [experts, 2*moe_ffn, hidden] with gate and up fused, `mlp.experts.down_proj`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nemo_muon.models.specs import ModelSpec

if TYPE_CHECKING:  # torch / transformers load only when a model is built
    import torch
    from transformers import PretrainedConfig

INITIALIZER_RANGE = 0.02
"""Std of the normal init of linear and embedding weights (the HF default of both families)."""
RMS_NORM_EPS = 1e-6


def hf_config(spec: ModelSpec) -> PretrainedConfig:
    """The HF config of a ModelSpec: `DeepseekV3Config` for family deepseek_v3, `Qwen3MoeConfig` for qwen3_moe."""
    spec.validate()
    common: dict[str, Any] = dict(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_attention_heads,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_embeddings,
        initializer_range=INITIALIZER_RANGE,
        rms_norm_eps=RMS_NORM_EPS,
        attention_dropout=0.0,
        use_cache=False,
    )
    if spec.family == "deepseek_v3":
        from transformers import DeepseekV3Config

        if not spec.num_experts:
            raise ValueError(f"model[{spec.name}].num_experts must be >= 1 for family 'deepseek_v3'; got 0")
        return DeepseekV3Config(
            **common,
            num_key_value_heads=spec.num_attention_heads,  # MLA: every head has its own decompressed K/V
            q_lora_rank=spec.q_lora_rank or None,
            kv_lora_rank=spec.kv_lora_rank,
            qk_nope_head_dim=spec.qk_nope_head_dim,
            qk_rope_head_dim=spec.qk_rope_head_dim,
            v_head_dim=spec.v_head_dim,
            intermediate_size=spec.ffn_hidden_size or spec.moe_ffn_hidden_size,
            moe_intermediate_size=spec.moe_ffn_hidden_size,
            first_k_dense_replace=spec.num_dense_layers,
            n_routed_experts=spec.num_experts,
            num_experts_per_tok=spec.moe_top_k,
            n_shared_experts=spec.num_shared_experts,
            # One routing group: group-limited routing (Kimi K2 uses n_group=1 too) needs experts % groups == 0.
            n_group=1,
            topk_group=1,
        )
    from transformers import Qwen3MoeConfig

    if spec.num_shared_experts:
        raise ValueError(
            f"model[{spec.name}].num_shared_experts must be 0 for family 'qwen3_moe' (no shared expert); "
            f"got {spec.num_shared_experts}"
        )
    return Qwen3MoeConfig(
        **common,
        num_key_value_heads=spec.num_query_groups,
        head_dim=spec.head_dim,
        intermediate_size=spec.ffn_hidden_size or spec.moe_ffn_hidden_size,
        moe_intermediate_size=spec.moe_ffn_hidden_size or spec.ffn_hidden_size,
        num_experts=spec.num_experts,
        num_experts_per_tok=spec.moe_top_k or 1,
        decoder_sparse_step=1,
        mlp_only_layers=list(range(spec.num_dense_layers)) if spec.num_experts else list(range(spec.num_layers)),
        norm_topk_prob=True,
    )


def build_model(spec: ModelSpec, *, seed: int) -> torch.nn.Module:
    """A freshly initialized causal-LM of the spec's family, in fp32 on the CPU, identical for equal seeds."""
    import torch
    from transformers import AutoModelForCausalLM

    config = hf_config(spec)
    devices = torch.random.fork_rng(devices=[])  # leave the caller's global RNG untouched
    with devices:
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Number of parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())
