"""A ModelSpec's parameter list as data: name, shape, kind, layer and expert of every parameter (torch-free).

Naming follows Megatron-Core's GPT/MoE module tree (the backend the big recipes run on):

- ``embedding.word_embeddings.weight`` (vocab, hidden) and ``output_layer.weight`` (vocab, hidden) unless tied;
  ``decoder.final_layernorm.weight``.
- Per layer ``decoder.layers.{i}.``: ``input_layernorm.weight``, ``pre_mlp_layernorm.weight``;
  MLA (DeepseekV3 family): ``self_attention.linear_q_down_proj.weight`` (q_lora_rank, hidden),
  ``self_attention.linear_q_up_proj.weight`` (heads*(qk_nope+qk_rope), q_lora_rank) or, without query compression,
  ``self_attention.linear_q_proj.weight`` (heads*(qk_nope+qk_rope), hidden); ``self_attention.linear_kv_down_proj.weight``
  (kv_lora_rank+qk_rope, hidden), ``self_attention.linear_kv_up_proj.weight`` (heads*(qk_nope+v), kv_lora_rank),
  ``self_attention.q_layernorm.weight`` (q_lora_rank), ``self_attention.kv_layernorm.weight`` (kv_lora_rank);
  GQA (Qwen3-MoE family): ``self_attention.linear_qkv.weight`` ((heads+2*groups)*head_dim, hidden),
  ``self_attention.q_layernorm.weight`` / ``k_layernorm.weight`` (head_dim); both: ``self_attention.linear_proj.weight``
  (hidden, heads*v_dim).
- Dense MLP: ``mlp.linear_fc1.weight`` (2*ffn, hidden), ``mlp.linear_fc2.weight`` (hidden, ffn). MoE:
  ``mlp.router.weight`` (experts, hidden), ``mlp.experts.local_experts.{j}.linear_fc1.weight`` (2*moe_ffn, hidden) and
  ``.linear_fc2.weight`` (hidden, moe_ffn) with ``j`` the global expert index, ``mlp.shared_experts.linear_fc1.weight``
  (2*shared*moe_ffn, hidden) and ``.linear_fc2.weight``.

Megatron stores the fused tensors above; Muon orthogonalizes their parts separately when asked. With
``split_gate_up=True`` a ``linear_fc1.weight`` appears as two entries ``linear_fc1.weight[gate]`` and
``linear_fc1.weight[up]``; with ``split_qkv=True`` a ``linear_qkv.weight`` appears as ``[q]``, ``[k]``, ``[v]`` (Megatron's
``muon_split_qkv`` split: Q of all query groups, then K, then V). ``ParamInfo.tensor_name`` strips the bracket.
Transformer Engine fuses some norms into the next linear (``linear_qkv.layer_norm_weight``); we keep the plain
module names: the shapes and counts are the same. Buffers (RoPE tables, the DeepseekV3 router's expert bias) are
not parameters and are not listed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from nemo_muon.models.specs import ModelSpec

Kind = Literal["attention", "expert", "shared_expert", "dense_mlp", "router", "embedding", "head", "norm"]
KINDS: tuple[str, ...] = ("attention", "expert", "shared_expert", "dense_mlp", "router", "embedding", "head", "norm")
HIDDEN_MATRIX_KINDS: tuple[str, ...] = ("attention", "expert", "shared_expert", "dense_mlp", "router")
"""Kinds whose 2-D weights Muon orthogonalizes; embeddings, the head and norms go to AdamW."""


@dataclass(frozen=True)
class ParamInfo:
    """One parameter (or one Muon-separate part of a fused parameter) of a model."""

    name: str
    shape: tuple[int, ...]
    kind: Kind
    layer: int | None = None
    """Decoder layer index (0-based); None for embedding, head and final norm."""
    expert: int | None = None
    """Global routed-expert index for kind 'expert'; None otherwise."""

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def tensor_name(self) -> str:
        """The name of the stored tensor (a split part's name without its ``[part]`` suffix)."""
        return self.name.split("[", 1)[0]

    @property
    def is_hidden_matrix(self) -> bool:
        """True for the 2-D weights Muon orthogonalizes (attention, MLP, expert and router matrices)."""
        return len(self.shape) == 2 and self.kind in HIDDEN_MATRIX_KINDS


def _fc1(prefix: str, width: int, hidden: int, kind: Kind, layer: int, expert: int | None,
         split_gate_up: bool) -> list[ParamInfo]:
    name = f"{prefix}.linear_fc1.weight"
    if split_gate_up:
        return [ParamInfo(f"{name}[{part}]", (width, hidden), kind, layer, expert) for part in ("gate", "up")]
    return [ParamInfo(name, (2 * width, hidden), kind, layer, expert)]


def _mlp(prefix: str, width: int, hidden: int, kind: Kind, layer: int, expert: int | None,
         split_gate_up: bool) -> list[ParamInfo]:
    """A SwiGLU MLP: fused gate/up projection and down projection."""
    return _fc1(prefix, width, hidden, kind, layer, expert, split_gate_up) + [
        ParamInfo(f"{prefix}.linear_fc2.weight", (hidden, width), kind, layer, expert)
    ]


def _mla_attention(spec: ModelSpec, p: str, i: int) -> list[ParamInfo]:
    h, nh = spec.hidden_size, spec.num_attention_heads
    qk_dim = spec.qk_nope_head_dim + spec.qk_rope_head_dim
    out: list[ParamInfo] = []
    if spec.q_lora_rank:
        out += [
            ParamInfo(f"{p}.linear_q_down_proj.weight", (spec.q_lora_rank, h), "attention", i),
            ParamInfo(f"{p}.q_layernorm.weight", (spec.q_lora_rank,), "norm", i),
            ParamInfo(f"{p}.linear_q_up_proj.weight", (nh * qk_dim, spec.q_lora_rank), "attention", i),
        ]
    else:
        out.append(ParamInfo(f"{p}.linear_q_proj.weight", (nh * qk_dim, h), "attention", i))
    out += [
        ParamInfo(f"{p}.linear_kv_down_proj.weight", (spec.kv_lora_rank + spec.qk_rope_head_dim, h), "attention", i),
        ParamInfo(f"{p}.kv_layernorm.weight", (spec.kv_lora_rank,), "norm", i),
        ParamInfo(f"{p}.linear_kv_up_proj.weight",
                  (nh * (spec.qk_nope_head_dim + spec.v_head_dim), spec.kv_lora_rank), "attention", i),
        ParamInfo(f"{p}.linear_proj.weight", (h, nh * spec.v_head_dim), "attention", i),
    ]
    return out


def _gqa_attention(spec: ModelSpec, p: str, i: int, split_qkv: bool) -> list[ParamInfo]:
    h, d = spec.hidden_size, spec.head_dim
    q_rows, kv_rows = spec.num_attention_heads * d, spec.num_query_groups * d
    if split_qkv:
        qkv = [ParamInfo(f"{p}.linear_qkv.weight[{part}]", (rows, h), "attention", i)
               for part, rows in (("q", q_rows), ("k", kv_rows), ("v", kv_rows))]
    else:
        qkv = [ParamInfo(f"{p}.linear_qkv.weight", (q_rows + 2 * kv_rows, h), "attention", i)]
    return qkv + [
        ParamInfo(f"{p}.q_layernorm.weight", (d,), "norm", i),
        ParamInfo(f"{p}.k_layernorm.weight", (d,), "norm", i),
        ParamInfo(f"{p}.linear_proj.weight", (h, q_rows), "attention", i),
    ]


def layer_params(spec: ModelSpec, layer: int, *, split_gate_up: bool = True, split_qkv: bool = True) -> list[ParamInfo]:
    """The parameters of decoder layer ``layer`` (0-based)."""
    if not (0 <= layer < spec.num_layers):
        raise ValueError(f"layer must be in [0, {spec.num_layers}) for model {spec.name}; got {layer!r}")
    h, p = spec.hidden_size, f"decoder.layers.{layer}"
    out = [ParamInfo(f"{p}.input_layernorm.weight", (h,), "norm", layer)]
    if spec.attention == "mla":
        out += _mla_attention(spec, f"{p}.self_attention", layer)
    else:
        out += _gqa_attention(spec, f"{p}.self_attention", layer, split_qkv)
    out.append(ParamInfo(f"{p}.pre_mlp_layernorm.weight", (h,), "norm", layer))
    if is_moe_layer(spec, layer):
        m = f"{p}.mlp"
        out.append(ParamInfo(f"{m}.router.weight", (spec.num_experts, h), "router", layer))
        for j in range(spec.num_experts):
            out += _mlp(f"{m}.experts.local_experts.{j}", spec.moe_ffn_hidden_size, h, "expert", layer, j,
                        split_gate_up)
        if spec.num_shared_experts:
            out += _mlp(f"{m}.shared_experts", spec.num_shared_experts * spec.moe_ffn_hidden_size, h,
                        "shared_expert", layer, None, split_gate_up)
    else:
        out += _mlp(f"{p}.mlp", spec.ffn_hidden_size, h, "dense_mlp", layer, None, split_gate_up)
    return out


def is_moe_layer(spec: ModelSpec, layer: int) -> bool:
    """True when decoder layer ``layer`` has a routed-expert MLP (DeepseekV3: after the first dense layers)."""
    return spec.num_experts > 0 and layer >= spec.num_dense_layers


def matrix_params(spec: ModelSpec, *, split_gate_up: bool = True, split_qkv: bool = True) -> list[ParamInfo]:
    """Every parameter of ``spec`` in model order (embedding, layers, final norm, head).

    Fused gate/up and QKV weights are listed as their separate parts when ``split_gate_up`` / ``split_qkv`` (the
    matrices Muon orthogonalizes); numel sums are the same either way. Filter with ``ParamInfo.is_hidden_matrix``
    for the Muon matrices.
    """
    first, last = non_layer_params(spec)
    out = list(first)
    for i in range(spec.num_layers):
        out += layer_params(spec, i, split_gate_up=split_gate_up, split_qkv=split_qkv)
    return out + last


def non_layer_params(spec: ModelSpec) -> tuple[list[ParamInfo], list[ParamInfo]]:
    """(parameters before the decoder layers, parameters after them): the embedding; the final norm and head."""
    h = spec.hidden_size
    last = [ParamInfo("decoder.final_layernorm.weight", (h,), "norm")]
    if not spec.tie_embeddings:
        last.append(ParamInfo("output_layer.weight", (spec.vocab_size, h), "head"))
    return [ParamInfo("embedding.word_embeddings.weight", (spec.vocab_size, h), "embedding")], last


def param_counts(spec: ModelSpec) -> tuple[int, int]:
    """(total, active) parameter counts of ``spec`` without listing every expert of every layer (fast for Kimi K2).

    Active = everything except routed experts, plus top_k/num_experts of them (see ``active_params``)."""
    first, last = non_layer_params(spec)
    total = active = total_params(first + last)
    per_kind: dict[bool, tuple[int, int]] = {}
    for i in range(spec.num_layers):
        moe = is_moe_layer(spec, i)
        if moe not in per_kind:
            ps = layer_params(spec, i)
            per_kind[moe] = (total_params(ps), active_params(spec, ps))
        total += per_kind[moe][0]
        active += per_kind[moe][1]
    return total, active


def total_params(params: Iterable[ParamInfo]) -> int:
    """Number of parameters in ``params``."""
    return sum(p.numel for p in params)


def active_params(spec: ModelSpec, params: Iterable[ParamInfo] | None = None) -> int:
    """Parameters one token uses: everything except routed experts, plus top_k/num_experts of them
    (embedding and head included, as in the public "activated parameters" figures)."""
    params = matrix_params(spec) if params is None else params
    total = 0.0
    for p in params:
        total += p.numel * (spec.moe_top_k / spec.num_experts if p.kind == "expert" else 1)
    return round(total)
