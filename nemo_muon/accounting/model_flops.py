"""Model FLOPs per token and per step, following Megatron's convention (torch-free).

Convention: Megatron-LM / Megatron-Bridge ``num_floating_point_operations`` (the number behind Bridge's
"throughput per GPU (TFLOP/s/GPU)" log line), re-derived here from the parameter list:

- Every weight a token passes through costs 6 FLOPs per token: 2 forward (multiply + add) and 4 backward
  (data gradient + weight gradient). Routed experts count top_k experts per token; shared experts and the
  leading dense layers count in full.
- Core attention is causal and counted at half the square: forward QKᵀ and A·V cost s·heads·(d_qk + d_v) per
  token per layer (2·s·... halved), so 3·s·heads·(d_qk + d_v) with the backward. For MLA d_qk = qk_nope + qk_rope.
- The logit layer costs 6·hidden·padded_vocab per token; the embedding lookup costs nothing.
- MLA's query / key-value RMSNorms add 6·(q_lora_rank + kv_lora_rank) per token per layer (Megatron's "+1" terms);
  other norms, softmax, activations and the router GEMM are not counted (``include_router=True`` adds 6·hidden·experts
  per MoE layer for a hardware count).
- Activation recompute re-runs forwards: it does not change model FLOPs (MFU) but adds hardware FLOPs (HFU).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nemo_muon._validation import check_positive_int, fail
from nemo_muon.models.matrices import is_moe_layer, layer_params
from nemo_muon.models.specs import ModelSpec

RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn", "mla_up_proj", "mlp", "moe", "shared_experts", "layernorm",
                                      "moe_act")
"""Megatron's selective-recompute module names we account for (layernorm and moe_act have no GEMM FLOPs)."""
RECOMPUTE_GRANULARITIES: tuple[str, ...] = ("none", "selective", "full")


@dataclass(frozen=True)
class ModelFlops:
    """FLOPs per token, forward + backward, by part. ``total`` is the model (MFU) count."""

    attention_linear: float
    attention_core: float
    dense_mlp: float
    moe_routed: float
    moe_shared: float
    router: float
    logits: float
    recompute: float
    """Extra forward FLOPs of activation recompute (hardware FLOPs only)."""

    @property
    def total(self) -> float:
        """Model FLOPs per token (Megatron's count; recompute excluded)."""
        return (self.attention_linear + self.attention_core + self.dense_mlp + self.moe_routed + self.moe_shared
                + self.router + self.logits)

    @property
    def hardware_total(self) -> float:
        """FLOPs the GPUs execute per token, recompute included."""
        return self.total + self.recompute


def padded_vocab_size(vocab_size: int, tp: int = 1, divisible_by: int = 128) -> int:
    """Megatron pads the vocabulary to a multiple of ``divisible_by * tp``."""
    check_positive_int("tp", tp)
    check_positive_int("make_vocab_size_divisible_by", divisible_by)
    mult = divisible_by * tp
    return -(-vocab_size // mult) * mult


def _layer_weights(spec: ModelSpec, layer: int) -> dict[str, float]:
    """Weights one token passes through in ``layer``, by ParamInfo.kind (routed experts: top_k of them)."""
    numels: dict[str, int] = {}
    for p in layer_params(spec, layer):
        if len(p.shape) == 2:
            numels[p.kind] = numels.get(p.kind, 0) + p.numel
    out = {kind: float(n) for kind, n in numels.items()}
    if "expert" in numels:
        out["expert"] = numels["expert"] * spec.moe_top_k / spec.num_experts
    return out


def _up_proj_weights(spec: ModelSpec) -> float:
    """Weights of MLA's up-projections (what Megatron's 'mla_up_proj' recompute re-runs)."""
    nh = spec.num_attention_heads
    q_up = nh * (spec.qk_nope_head_dim + spec.qk_rope_head_dim) * spec.q_lora_rank
    kv_up = nh * (spec.qk_nope_head_dim + spec.v_head_dim) * spec.kv_lora_rank
    return float(q_up + kv_up)


def _check_recompute(granularity: str, modules: Sequence[str]) -> None:
    if granularity not in RECOMPUTE_GRANULARITIES:
        raise fail("recompute_granularity", granularity, f"one of {RECOMPUTE_GRANULARITIES}")
    for m in modules:
        if m not in RECOMPUTE_MODULES:
            raise fail("recompute_modules", m, f"one of {RECOMPUTE_MODULES}")
    if modules and granularity != "selective":
        raise fail("recompute_modules", tuple(modules), "empty unless recompute_granularity='selective'")


def model_flops_per_token(spec: ModelSpec, seq_length: int, *, tp: int = 1, recompute_granularity: str = "none",
                          recompute_modules: Sequence[str] = (), include_router: bool = False,
                          make_vocab_size_divisible_by: int = 128) -> ModelFlops:
    """FLOPs per token of one training step (forward + backward) of ``spec`` at ``seq_length``.

    ``recompute_granularity='selective'`` with ``recompute_modules`` (Megatron names, default ('core_attn',) when
    empty) or ``'full'`` (every decoder layer's forward again) adds ``ModelFlops.recompute``.
    """
    check_positive_int("seq_length", seq_length)
    _check_recompute(recompute_granularity, recompute_modules)
    if recompute_granularity == "selective" and not recompute_modules:
        recompute_modules = ("core_attn",)
    if "mla_up_proj" in recompute_modules and spec.attention != "mla":
        raise fail("recompute_modules", "mla_up_proj", f"used only with MLA models ({spec.name} is {spec.attention})")
    nh = spec.num_attention_heads
    if spec.attention == "mla":
        qk, v = spec.qk_nope_head_dim + spec.qk_rope_head_dim, spec.v_head_dim
        norm_weights = spec.q_lora_rank + spec.kv_lora_rank
    else:
        qk = v = spec.head_dim
        norm_weights = 0
    core = 3.0 * seq_length * nh * (qk + v) * spec.num_layers
    parts = dict(attention=0.0, dense_mlp=0.0, expert=0.0, shared_expert=0.0, router=0.0)
    dense = _layer_weights(spec, 0) if spec.num_dense_layers or not spec.num_experts else None
    moe = _layer_weights(spec, spec.num_dense_layers) if spec.num_experts else None
    for i in range(spec.num_layers):
        w = moe if is_moe_layer(spec, i) else dense
        for kind, numel in w.items():
            parts[kind] += 6.0 * numel
        parts["attention"] += 6.0 * norm_weights
    router = parts["router"] if include_router else 0.0
    logits = 6.0 * spec.hidden_size * padded_vocab_size(spec.vocab_size, tp, make_vocab_size_divisible_by)
    recompute = 0.0
    if recompute_granularity == "full":
        recompute = (parts["attention"] + core + parts["dense_mlp"] + parts["expert"] + parts["shared_expert"]
                     + router) / 3.0
    else:
        if "core_attn" in recompute_modules:
            recompute += core / 3.0
        if "mla_up_proj" in recompute_modules:
            recompute += 2.0 * _up_proj_weights(spec) * spec.num_layers
        if "mlp" in recompute_modules:
            recompute += parts["dense_mlp"] / 3.0
        if "moe" in recompute_modules:
            recompute += (parts["expert"] + parts["shared_expert"] + router) / 3.0
        elif "shared_experts" in recompute_modules:
            recompute += parts["shared_expert"] / 3.0
    return ModelFlops(attention_linear=parts["attention"], attention_core=core, dense_mlp=parts["dense_mlp"],
                      moe_routed=parts["expert"], moe_shared=parts["shared_expert"], router=router, logits=logits,
                      recompute=recompute)


def model_flops_per_step(spec: ModelSpec, seq_length: int, global_batch_size: int, **kwargs: object) -> float:
    """Model FLOPs of one optimizer step: per-token FLOPs x global_batch_size x seq_length (kwargs as above)."""
    check_positive_int("global_batch_size", global_batch_size)
    return model_flops_per_token(spec, seq_length, **kwargs).total * global_batch_size * seq_length
