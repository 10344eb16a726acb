"""The one module the local (no-TE) spec lacks for Kimi K2's multi-latent attention: a torch SDPA core attention.

``megatron/core/transformer/multi_latent_attention.py`` (``MLASelfAttention.__init__``) builds its core attention
with ``k_channels=q_head_dim, v_channels=v_head_dim``: Transformer Engine's ``TEDotProductAttention`` takes them,
Megatron's local ``DotProductAttention`` does not (``TypeError: ... unexpected keyword argument 'k_channels'``) and
assumes one head size for keys and values. `MLACoreAttention` is causal softmax attention with MLA's
``softmax_scale`` (YaRN mscale included) and separate key/value head sizes, via torch's SDPA;
`with_local_mla_attention` puts it into a decoder block spec in place of the local one. Preflight's tiny model
(`nemo_muon.preflight.tiny_model`) and the CPU harness of the tests build MLA layers with it, on any device.
"""

from __future__ import annotations

from typing import Any

import torch


class MLACoreAttention(torch.nn.Module):
    """Core attention [s, b, h, d_qk] x [s, b, h, d_qk] x [s, b, h, d_v] -> [s, b, h * d_v], causal."""

    def __init__(self, config: Any, layer_number: int, attn_mask_type: Any, attention_type: str,
                 softmax_scale: float | None = None, k_channels: int | None = None, v_channels: int | None = None,
                 **unused: Any) -> None:
        super().__init__()
        self.softmax_scale = softmax_scale
        self.hidden_size_per_attention_head_v = v_channels

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                attn_mask_type: Any = None, attention_bias: Any = None, packed_seq_params: Any = None) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("MLACoreAttention (the local spec's MLA core attention) supports neither packed sequences nor a bias")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale)
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def with_local_mla_attention(block_spec: Any) -> Any:
    """Replace the core attention of every MLA layer of a decoder block spec by `MLACoreAttention` (in place)."""
    from megatron.core.transformer.multi_latent_attention import MLASelfAttention

    submodules = getattr(block_spec, "submodules", block_spec)  # a ModuleSpec or TransformerBlockSubmodules
    for layer in submodules.layer_specs:
        attention = layer.submodules.self_attention
        if attention.module is MLASelfAttention:
            attention.submodules.core_attention = MLACoreAttention
    return block_spec
