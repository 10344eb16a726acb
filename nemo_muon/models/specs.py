"""Architecture numbers of the model families the recipes train, written once.

The planner, the FLOP accounting, the recipes (Megatron-Bridge and torch backends) and the HF model builder all
read these objects; nothing copies the numbers. Sources: the public HF `config.json` of moonshotai/Kimi-K2-Instruct
(model_type kimi_k2 = DeepseekV3 architecture) and Qwen/Qwen3-30B-A3B.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from nemo_muon._validation import check_choice, check_positive_int, validate_once

MIN_VOCAB_SIZE = 2
"""A vocabulary of one token has nothing to predict (the loss is 0 from the first step)."""

Family = Literal["deepseek_v3", "qwen3_moe"]
FAMILIES: tuple[str, ...] = ("deepseek_v3", "qwen3_moe")


def _check_even(field: str, value: int) -> None:
    """RoPE rotates pairs of channels: the rotary head dimension must be even (HF refuses odd ones when it builds)."""
    if value % 2:
        raise ValueError(f"{field} must be an even number (RoPE rotates pairs of channels); got {value}")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """A decoder-only transformer with MLA or GQA attention and dense and/or MoE MLPs (SwiGLU everywhere)."""

    name: str
    family: Family
    """HF architecture family: deepseek_v3 (Kimi K2, MLA) or qwen3_moe (GQA with QK-norm)."""
    num_layers: int
    hidden_size: int
    vocab_size: int
    num_attention_heads: int
    # --- GQA attention (family qwen3_moe) ---
    num_query_groups: int = 0
    """Key/value heads (GQA); 0 for MLA."""
    head_dim: int = 0
    # --- MLA attention (family deepseek_v3) ---
    q_lora_rank: int = 0
    """Rank of the query down-projection; 0 = no query compression."""
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # --- MLP ---
    ffn_hidden_size: int = 0
    """Intermediate size of the dense (non-MoE) layers."""
    num_dense_layers: int = 0
    """Leading dense layers before the MoE layers (DeepseekV3 first_k_dense_replace)."""
    num_experts: int = 0
    """Routed experts per MoE layer (0 = dense model)."""
    moe_ffn_hidden_size: int = 0
    moe_top_k: int = 0
    num_shared_experts: int = 0
    """Shared experts per MoE layer, each of width moe_ffn_hidden_size."""
    tie_embeddings: bool = False
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        validate_once(self)

    @property
    def attention(self) -> str:
        """'mla' for DeepseekV3-family models, 'gqa' otherwise."""
        return "mla" if self.family == "deepseek_v3" else "gqa"

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.num_experts else 0

    def validate(self) -> None:
        """Check the numbers are a buildable architecture."""
        f = f"model[{self.name}]"
        check_choice(f"{f}.family", self.family, FAMILIES)
        for field in ("num_layers", "hidden_size", "num_attention_heads", "max_position_embeddings"):
            check_positive_int(f"{f}.{field}", getattr(self, field))
        check_positive_int(f"{f}.vocab_size", self.vocab_size, minimum=MIN_VOCAB_SIZE)
        for field in dataclasses.fields(self):  # every count >= 0 and bounded; the family's own rules follow
            if field.type in ("int", int):
                check_positive_int(f"{f}.{field.name}", getattr(self, field.name), minimum=0)
        if self.family == "deepseek_v3":
            for field in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
                check_positive_int(f"{f}.{field}", getattr(self, field))
            check_positive_int(f"{f}.q_lora_rank", self.q_lora_rank, minimum=0)
            _check_even(f"{f}.qk_rope_head_dim", self.qk_rope_head_dim)
        else:
            check_positive_int(f"{f}.num_query_groups", self.num_query_groups)
            check_positive_int(f"{f}.head_dim", self.head_dim)
            _check_even(f"{f}.head_dim", self.head_dim)  # Qwen3 rotates the whole head
            if self.num_attention_heads % self.num_query_groups:
                raise ValueError(
                    f"{f}.num_attention_heads must be a multiple of num_query_groups ({self.num_query_groups}); "
                    f"got {self.num_attention_heads}"
                )
        check_positive_int(f"{f}.num_dense_layers", self.num_dense_layers, minimum=0)
        if self.num_dense_layers > self.num_layers:
            raise ValueError(f"{f}.num_dense_layers must be <= num_layers ({self.num_layers}); got {self.num_dense_layers}")
        if self.num_experts:
            check_positive_int(f"{f}.moe_ffn_hidden_size", self.moe_ffn_hidden_size)
            check_positive_int(f"{f}.moe_top_k", self.moe_top_k)
            if self.moe_top_k > self.num_experts:
                raise ValueError(f"{f}.moe_top_k must be <= num_experts ({self.num_experts}); got {self.moe_top_k}")
        if self.num_dense_layers or not self.num_experts:
            check_positive_int(f"{f}.ffn_hidden_size", self.ffn_hidden_size)

    def replace(self, **changes: object) -> ModelSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)


KIMI_K2 = ModelSpec(
    name="kimi_k2",
    family="deepseek_v3",
    num_layers=61,
    hidden_size=7168,
    vocab_size=163840,
    num_attention_heads=64,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    ffn_hidden_size=18432,
    num_dense_layers=1,
    num_experts=384,
    moe_ffn_hidden_size=2048,
    moe_top_k=8,
    num_shared_experts=1,
    max_position_embeddings=131072,
)

QWEN3_30B_A3B = ModelSpec(
    name="qwen3_30b_a3b",
    family="qwen3_moe",
    num_layers=48,
    hidden_size=2048,
    vocab_size=151936,
    num_attention_heads=32,
    num_query_groups=4,
    head_dim=128,
    ffn_hidden_size=6144,
    num_dense_layers=0,
    num_experts=128,
    moe_ffn_hidden_size=768,
    moe_top_k=8,
    num_shared_experts=0,
    max_position_embeddings=40960,
)

# Tiny members of the same families that train on a 2-core CPU in minutes (the torch backend's models).
TINY_KIMI_K2 = KIMI_K2.replace(
    name="tiny_kimi_k2",
    num_layers=4,
    hidden_size=128,
    vocab_size=4096,
    num_attention_heads=4,
    q_lora_rank=64,
    kv_lora_rank=32,
    qk_nope_head_dim=32,
    qk_rope_head_dim=16,
    v_head_dim=32,
    ffn_hidden_size=384,
    num_dense_layers=1,
    num_experts=8,
    moe_ffn_hidden_size=96,
    moe_top_k=2,
    num_shared_experts=1,
    max_position_embeddings=512,
)

TINY_QWEN3_MOE = QWEN3_30B_A3B.replace(
    name="tiny_qwen3_moe",
    num_layers=4,
    hidden_size=128,
    vocab_size=4096,
    num_attention_heads=4,
    num_query_groups=2,
    head_dim=32,
    ffn_hidden_size=384,
    num_experts=8,
    moe_ffn_hidden_size=96,
    moe_top_k=2,
    max_position_embeddings=512,
)

MODEL_SPECS: dict[str, ModelSpec] = {s.name: s for s in (KIMI_K2, QWEN3_30B_A3B, TINY_KIMI_K2, TINY_QWEN3_MOE)}


def get_model_spec(name: str) -> ModelSpec:
    """Look up a model spec by name."""
    if name not in MODEL_SPECS:
        raise ValueError(f"model must be one of {tuple(sorted(MODEL_SPECS))}; got {name!r}")
    return MODEL_SPECS[name]
