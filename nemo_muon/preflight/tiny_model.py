"""The tiny model of a recipe's family, built by Megatron-Core's `GPTModel` with its local (no Transformer Engine) spec.

Preflight and the CPU harness of the tests build the same model: the architecture fields of the family
(`nemo_muon.models.megatron_fields`: MLA or GQA attention, routed and shared experts, dense first layers), shrunk to
the tiny spec (`nemo_muon.models.specs`), in bf16 under `Float16Module`. `LOCAL_SPEC_FIELDS` are the kernel choices
the local spec needs on any device: no fused kernels (they need Transformer Engine / Apex), the allgather token
dispatcher, no grouped GEMM; MLA's core attention is `nemo_muon.preflight.mla_attention`'s.
"""

from __future__ import annotations

import dataclasses
from typing import Any

SEQ = 32
"""Tokens per sequence of the tiny model's batches."""
TINY_OF_FAMILY: dict[str, str] = {"deepseek_v3": "tiny_kimi_k2", "qwen3_moe": "tiny_qwen3_moe"}
"""Model family of a recipe -> the tiny model spec preflight trains."""
LOCAL_SPEC_FIELDS: dict[str, Any] = {
    # fused kernels need Transformer Engine / Apex: Megatron's unfused paths instead
    "bias_activation_fusion": False, "bias_dropout_fusion": False, "masked_softmax_fusion": False,
    "gradient_accumulation_fusion": False, "apply_rope_fusion": False, "persist_layer_norm": False,
    "cross_entropy_loss_fusion": False, "moe_permute_fusion": False, "moe_router_fusion": False,
    # the flex / alltoall dispatchers need CUDA streams and DeepEP/HybridEP; allgather runs everywhere
    "moe_token_dispatcher_type": "allgather", "moe_grouped_gemm": False,
}
DENSE_DROPS = ("num_moe_experts", "moe_ffn_hidden_size", "moe_router_topk", "moe_aux_loss_coeff", "moe_layer_freq",
               "moe_shared_expert_intermediate_size")
"""MoE fields dropped for the dense variant of a tiny model (``dense=True``): Megatron requires sequence
parallelism for MoE under tensor parallelism, which the local spec's torch norms do not support."""


def tiny_spec_of_family(family: str) -> str:
    """The tiny model spec of a model family; ValueError naming the allowed families otherwise."""
    if family not in TINY_OF_FAMILY:
        raise ValueError(f"model.family must be one of {sorted(TINY_OF_FAMILY)} for preflight; got {family!r}")
    return TINY_OF_FAMILY[family]


def build_tiny_model(spec_name: str, tp: int = 1, dense: bool = False, ep: int = 1, seq: int = SEQ, pp: int = 1,
                     vp_stage: int | None = None, vp: int = 1, mixed_precision_wrap: bool = True) -> tuple[Any, Any, Any]:
    """(Float16Module(GPTModel), its TransformerConfig, the ModelSpec) of the spec ``spec_name`` at the given TP / EP /
    PP sizes (Megatron's parallel state must be initialized with them). ``dense``: drop the MoE layers (see
    `DENSE_DROPS`); ``vp_stage`` / ``vp``: one virtual-pipeline chunk; ``mixed_precision_wrap=False``: the bare
    bf16 `GPTModel` (Bridge's model setup wraps it in `Float16Module` itself)."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer import transformer_config as tc
    from megatron.core.transformer.module import Float16Module

    from nemo_muon.models.megatron_fields import config_class, model_fields, transformer_config_fields
    from nemo_muon.models.specs import get_model_spec
    from nemo_muon.preflight.mla_attention import with_local_mla_attention

    spec = get_model_spec(spec_name)
    cls = getattr(tc, config_class(spec))
    names = {f.name for f in dataclasses.fields(cls)}
    arch = transformer_config_fields(spec)
    if dense:
        arch = {k: v for k, v in arch.items() if k not in DENSE_DROPS and not k.startswith("moe_")}
    parallel = {"tensor_model_parallel_size": tp} if tp > 1 else {}
    if ep > 1:
        parallel["expert_model_parallel_size"] = ep
    if pp > 1:
        parallel["pipeline_model_parallel_size"] = pp
    if vp > 1:
        parallel["virtual_pipeline_model_parallel_size"] = vp
    config = cls(**{k: v for k, v in arch.items() if k in names}, **LOCAL_SPEC_FIELDS, use_cpu_initialization=True,
                 bf16=True, params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, **parallel)
    gpt_args = {k: v for k, v in arch.items() if k not in names}  # e.g. rotary_base: a GPTModel argument
    chunk = {"vp_stage": vp_stage} if vp_stage is not None else {}
    block_spec = with_local_mla_attention(get_gpt_decoder_block_spec(config, use_transformer_engine=False, **chunk))
    ends = {"ignore_virtual": False, "vp_stage": vp_stage} if vp_stage is not None else {}
    stage = {"pre_process": parallel_state.is_pipeline_first_stage(**ends),
             "post_process": parallel_state.is_pipeline_last_stage(**ends), **chunk} if pp > 1 else {}
    model = GPTModel(config=config, transformer_layer_spec=block_spec, max_sequence_length=seq, **model_fields(spec),
                     **gpt_args, **stage)
    return (Float16Module(config, model) if mixed_precision_wrap else model), config, spec
