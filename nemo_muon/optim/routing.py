"""Which update each parameter gets (orthogonalized / preconditioned matrix update, or AdamW), why, and fused layouts.

A parameter is routed by, in this order (``route_param``):
1. its param group's ``"algorithm"`` (``"matrix"`` / ``"adamw"``), then ``matrix_rule(name, shape)`` (None = no opinion);
2. what the model says it is (``ParamRole``, built by `nemo_muon.optim.param_roles` when the optimizer is given the
   ``nn.Module``): embeddings, weights tied to them and the output head, norms and biases go to AdamW; convolution
   kernels are refused; fused layouts it recognizes (``nn.MultiheadAttention.in_proj_weight``, HF GPT-2's Conv1D
   ``c_attn``) are split;
3. the name rule (``default_matrix_rule``), on the parameter's name (dot-separated segments) and shape:
   a. 0-D and 1-D tensors (norm weights, biases, scalars) and bias names (``bias``, ``bias_*``, ``*_bias``) -> ``adamw``;
   b. a name segment naming an embedding or the output head (``EMBEDDING_SEGMENTS``, ``HEAD_SEGMENTS``: HF
      ``embed_tokens`` / ``lm_head``, Megatron ``word_embeddings`` / ``output_layer``, GPT-2 ``wte`` / ``wpe``) -> ``adamw``;
   c. other 2-D matrices (attention, MLP, MoE router and shared experts) and 3-D stacks (E, out, in) of experts ->
      ``matrix`` (Muon's orthogonalized update / SOAP's preconditioned update; a 3-D stack per expert);
   d. anything else (4-D and up) cannot be placed: a ``ValueError`` names the parameter.
   A 2-D / 3-D parameter that goes to ``matrix`` by rule c although a word of its name hints at an embedding or a head
   (``HINT_WORDS``: ``emb``, ``head``, ``vocab``, ... as ``_``-separated words of a segment) is *unsure*: the optimizer
   reports all of them in one warning (`Route.unsure`), and ``opt.routes()`` shows them. With the module, a role the
   model settles (an embedding, the head) is never unsure.
An unnamed parameter (``model.parameters()``) of 2 or more dimensions is refused by the optimizers unless its group's
``"algorithm"`` or ``matrix_rule`` places it (`nemo_muon.optim.routed`).

Fused weights are split before the matrix update (each part is its own matrix), by the role, else by name segment:
- ``GateUpLayout``: gated-MLP [gate; up] stacked along the output dim: HF ``gate_up_proj`` (3-D experts
  (E, 2·I, H) in transformers 5.x) and Megatron ``linear_fc1`` (SwiGLU; register ``{"linear_fc1": None}`` for a
  non-gated MLP). On by default, switched by ``split_gate_up``.
- ``QKVLayout``: Megatron ``linear_qkv``, rows grouped per query group as [q heads of the group; k; v]; needs the
  head numbers, so pass ``fused_layouts={"linear_qkv": QKVLayout(...)}``; with ``split_qkv`` on and no layout given,
  a fused QKV weight is an error (never orthogonalized whole by accident). Q, K and V are each one matrix over all
  heads (Megatron-Core's convention). torch's ``in_proj_weight`` ((3E, E), [q; k; v]) is ``QKVLayout(1, 1, E)``,
  by its name alone too; GPT-2's ``c_attn`` (a Conv1D stored (in, out)) likewise on its columns (``Route.transposed``).
- MLA projections of HF DeepseekV3 (``q_a_proj``, ``q_b_proj``, ``kv_a_proj_with_mqa``, ``kv_b_proj``, ``o_proj``) are
  separate parameters and get one matrix update each; nothing to split.
Under tensor parallelism the split applies to the local shard (Megatron shards [gate; up] and QKV per rank so that
each local part is a shard of the global part).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nemo_muon._validation import check_positive_int

MATRIX, ADAMW = "matrix", "adamw"
ROUTE_NAMES: tuple[str, ...] = (MATRIX, ADAMW)
EMBEDDING_SEGMENTS: frozenset[str] = frozenset({"embed_tokens", "word_embeddings", "embeddings", "embedding", "wte",
                                                "wpe", "tok_embeddings", "position_embeddings"})
HEAD_SEGMENTS: frozenset[str] = frozenset({"lm_head", "output_layer"})
FUSED_QKV_SEGMENTS: frozenset[str] = frozenset({"linear_qkv", "qkv_proj", "query_key_value"})
IN_PROJ_SEGMENT = "in_proj_weight"
"""torch's fused [q; k; v] attribute (``nn.MultiheadAttention``, (3E, E)): split in three equal parts by name alone."""
HINT_WORDS: frozenset[str] = frozenset({"emb", "embed", "embeds", "embedding", "embeddings", "head", "heads", "lm",
                                        "logit", "logits", "vocab", "unembed", "unembedding", "tok", "token", "tokens",
                                        "pos", "position", "positional"})
"""Words (``_``-separated, in any segment) that make a name hint at an embedding or an output head; a 2-D / 3-D
parameter with one that the rule sends to the matrix update is reported as unsure. Not ``output``: BERT's hidden
``attention.output.dense`` would be flagged."""

MatrixRule = Callable[[str | None, tuple[int, ...]], str | None]


@dataclass(frozen=True)
class GateUpLayout:
    """[gate; up] of a gated MLP stacked along the output (second-to-last) dim, equal halves."""

    def split_sizes(self, name: str, rows: int) -> list[int]:
        if rows % 2:
            raise ValueError(f"fused gate/up parameter {name!r} must have an even output dim; got {rows}")
        return [rows // 2, rows // 2]


@dataclass(frozen=True)
class QKVLayout:
    """Megatron ``linear_qkv``: per query group, [num_attention_heads/num_query_groups q heads; 1 k head; 1 v head]."""

    num_attention_heads: int
    num_query_groups: int
    head_dim: int

    def __post_init__(self) -> None:
        check_positive_int("QKVLayout.num_attention_heads", self.num_attention_heads)
        check_positive_int("QKVLayout.num_query_groups", self.num_query_groups)
        check_positive_int("QKVLayout.head_dim", self.head_dim)
        if self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"QKVLayout.num_query_groups must divide num_attention_heads="
                             f"{self.num_attention_heads}; got {self.num_query_groups}")

    def group_shapes(self) -> list[int]:
        """Rows of q, k and v inside one query group."""
        return [self.num_attention_heads // self.num_query_groups * self.head_dim, self.head_dim, self.head_dim]


FusedLayout = GateUpLayout | QKVLayout
DEFAULT_FUSED_LAYOUTS: dict[str, FusedLayout | None] = {"gate_up_proj": GateUpLayout(), "linear_fc1": GateUpLayout()}


def _layout_from_spec(key: str, spec: Any) -> FusedLayout | None:
    if spec is None or isinstance(spec, (GateUpLayout, QKVLayout)):
        return spec
    if isinstance(spec, Mapping) and spec.get("kind") in ("gate_up", "qkv"):
        args = {k: v for k, v in spec.items() if k != "kind"}
        return GateUpLayout(**args) if spec["kind"] == "gate_up" else QKVLayout(**args)
    raise ValueError(f"fused_layouts[{key!r}] must be None, a GateUpLayout, a QKVLayout or a dict with kind "
                     f"'gate_up' or 'qkv'; got {spec!r}")


def resolve_layouts(fused_layouts: Mapping[str, Any] | None) -> dict[str, FusedLayout | None]:
    """The defaults updated with the user's ``fused_layouts`` (name segment -> layout, or None to disable)."""
    out = dict(DEFAULT_FUSED_LAYOUTS)
    for key, spec in (fused_layouts or {}).items():
        out[key] = _layout_from_spec(key, spec)
    return out


def _is_bias_name(segment: str) -> bool:
    return segment == "bias" or segment.startswith("bias_") or segment.endswith("_bias")


def name_reason(name: str | None, shape: Sequence[int]) -> tuple[str, str]:
    """The name rule (module docstring, rule 3) with its reason: ``(algorithm, reason)``."""
    segments = name.split(".") if name else []
    if len(shape) == 0:
        return ADAMW, "scalar (0-D)"
    if len(shape) == 1:
        return ADAMW, "1-D (norm weight, bias or vector)"
    if segments and _is_bias_name(segments[-1]):
        return ADAMW, f"bias by name ({segments[-1]!r})"
    for seg in segments:
        if seg in EMBEDDING_SEGMENTS:
            return ADAMW, f"embedding by name segment {seg!r}"
        if seg in HEAD_SEGMENTS:
            return ADAMW, f"output head by name segment {seg!r}"
    if len(shape) == 2:
        return MATRIX, "hidden matrix (2-D, name rule)"
    if len(shape) == 3:
        return MATRIX, "expert stack (3-D (E, out, in), name rule)"
    raise ValueError(f"parameter {name or '<unnamed>'!r} with shape {tuple(shape)} cannot be placed by the routing "
                     "rule (allowed: 0-D/1-D -> adamw, 2-D matrices and 3-D expert stacks -> matrix update); "
                     "pass matrix_rule or a param group with 'algorithm'")


def default_matrix_rule(name: str | None, shape: Sequence[int]) -> str:
    """The documented name rule (module docstring, rule 3): ``"matrix"`` or ``"adamw"``."""
    return name_reason(name, shape)[0]


def hint_word(name: str | None) -> str | None:
    """The first word of ``name`` that hints at an embedding or output head (``HINT_WORDS``), or None."""
    for seg in (name or "").split("."):
        for word in seg.lower().split("_"):
            if word in HINT_WORDS:
                return word
    return None


@dataclass(frozen=True)
class ParamRole:
    """What the model says one parameter is (`nemo_muon.optim.param_roles.module_roles`)."""

    reason: str
    """What it is, for ``routes()``: ``"embedding (nn.Embedding 'emb')"``, ``"Linear weight"``, ..."""
    algorithm: str | None = None
    """``"adamw"`` when the role settles the route (embedding, head, norm, bias); None leaves it to the name rule."""
    layout: FusedLayout | None = None
    """A fused layout the model's structure shows (nn.MultiheadAttention, GPT-2's ``c_attn``)."""
    transposed: bool = False
    """Stored (in, out) rather than (out, in) (HF Conv1D)."""
    refusal: str | None = None
    """Why no update fits it (a convolution kernel), unless a group's ``algorithm`` or ``matrix_rule`` places it."""


@dataclass(frozen=True)
class Route:
    """Where one parameter goes: ``algorithm`` and, for a fused matrix, how to split it (None = whole)."""

    algorithm: str
    layout: FusedLayout | None = None
    transposed: bool = False
    """The parameter stores the matrix as (in, out) (HF Conv1D): parts are split along its last dim and the scale
    reads its shape transposed."""
    reason: str = field(default="", compare=False)
    """Why it goes there (``opt.routes()``)."""
    unsure: bool = field(default=False, compare=False)
    """Sent to the matrix update by the name rule although its name hints at an embedding / output head."""

    def split_sizes(self, name: str, rows: int) -> list[int] | None:
        """Sizes of the parts along the split dim (-2; -1 when ``transposed``) in the order they are stacked (QKV: per
        group), or None."""
        if self.layout is None:
            return None
        if isinstance(self.layout, GateUpLayout):
            return self.layout.split_sizes(name, rows)
        per_group = sum(self.layout.group_shapes())
        if rows % per_group:
            raise ValueError(f"fused QKV parameter {name!r} has {rows} rows, not a multiple of one query group's "
                             f"{per_group} rows (q, k, v = {self.layout.group_shapes()})")
        return self.layout.group_shapes()


def _choose(name: str | None, shape: tuple[int, ...], matrix_rule: MatrixRule | None, forced: str | None,
            role: ParamRole | None) -> tuple[str, str, bool]:
    """``(algorithm, reason, unsure)`` by the order of the module docstring."""
    label = name or "<unnamed>"
    if forced is not None:
        return forced, f"param group 'algorithm'={forced!r}", False
    ruled = matrix_rule(name, shape) if matrix_rule is not None else None
    if ruled is not None:
        return ruled, f"matrix_rule -> {ruled!r}", False
    if role is not None and role.refusal:
        raise ValueError(f"parameter {label!r} with shape {shape} {role.refusal}; place it with matrix_rule or a param "
                         "group with 'algorithm'")
    if role is not None and role.algorithm is not None:
        return role.algorithm, role.reason, False
    algorithm, reason = name_reason(name, shape)
    if role is not None and algorithm == MATRIX:
        reason = f"{'hidden matrix' if len(shape) == 2 else 'expert stack'} ({role.reason})"
    word = hint_word(name) if algorithm == MATRIX else None
    if word is not None:
        reason = f"{reason}; unsure: the name's word {word!r} hints at an embedding or output head"
    return algorithm, reason, word is not None


def _name_layout(name: str, shape: tuple[int, ...], layouts: Mapping[str, FusedLayout | None],
                 split_qkv: bool) -> tuple[FusedLayout | None, str]:
    """The fused layout a name segment registers (``layouts``; torch's ``in_proj_weight``) and that segment; raises for
    a known fused QKV name without a layout while ``split_qkv`` is on."""
    segments = name.split(".")
    for seg in reversed(segments):
        if seg in layouts and layouts[seg] is not None:
            return layouts[seg], seg
        if seg == IN_PROJ_SEGMENT and len(shape) == 2 and shape[0] == 3 * shape[1]:
            return QKVLayout(num_attention_heads=1, num_query_groups=1, head_dim=shape[1]), seg
        if seg in FUSED_QKV_SEGMENTS and split_qkv:
            raise ValueError(f"parameter {name!r} is a fused QKV weight and split_qkv=True needs its layout: pass "
                             f"fused_layouts={{{seg!r}: QKVLayout(num_attention_heads=..., num_query_groups=..., "
                             "head_dim=...)}} or split_qkv=False")
    return None, ""


def route_param(
    name: str | None,
    shape: Sequence[int],
    *,
    matrix_rule: MatrixRule | None = None,
    forced: str | None = None,
    layouts: Mapping[str, FusedLayout | None] = DEFAULT_FUSED_LAYOUTS,
    split_qkv: bool = True,
    split_gate_up: bool = True,
    role: ParamRole | None = None,
) -> Route:
    """Route one parameter: ``forced`` (param group) > ``matrix_rule`` > ``role`` (the model) > the name rule; then its
    fused layout (the role's, else by name segment), honouring ``split_qkv`` / ``split_gate_up``."""
    label = name or "<unnamed>"
    shape = tuple(shape)
    algorithm, reason, unsure = _choose(name, shape, matrix_rule, forced, role)
    if algorithm not in ROUTE_NAMES:
        raise ValueError(f"routing of parameter {label!r} must be one of {ROUTE_NAMES}; got {algorithm!r}")
    if algorithm == MATRIX and len(shape) not in (2, 3):
        raise ValueError(f"parameter {label!r} with shape {shape} cannot take the matrix update "
                         "(allowed: 2-D matrices and 3-D expert stacks)")
    transposed = bool(role is not None and role.transposed and algorithm == MATRIX)
    if algorithm == ADAMW or not name:
        return Route(algorithm, transposed=transposed, reason=reason, unsure=unsure)
    if role is not None and role.layout is not None:
        layout, segment = role.layout, ""
    else:
        layout, segment = _name_layout(name, shape, layouts, split_qkv)
    if (isinstance(layout, QKVLayout) and not split_qkv) or (isinstance(layout, GateUpLayout) and not split_gate_up):
        layout = None
    if layout is None:
        return Route(algorithm, transposed=transposed, reason=reason, unsure=unsure)
    if segment:
        reason += f"; fused {'gate, up' if isinstance(layout, GateUpLayout) else 'q, k, v'} by name segment {segment!r}"
    route = Route(algorithm, layout, transposed, reason=reason, unsure=unsure)
    route.split_sizes(label, shape[-1] if transposed else shape[-2])  # validate now, not at the first step
    if isinstance(layout, QKVLayout) and len(shape) != 2:
        raise ValueError(f"fused QKV parameter {label!r} must be 2-D; got shape {shape}")
    return route
