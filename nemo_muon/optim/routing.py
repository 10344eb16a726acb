"""Which update each parameter gets (orthogonalized / preconditioned matrix update, or AdamW), and fused layouts.

Default rule (``default_matrix_rule``), on the parameter's name (dot-separated segments) and shape:
1. 0-D and 1-D tensors (norm weights, biases, scalars) -> ``adamw``.
2. A name segment naming an embedding or the output head (``EMBEDDING_SEGMENTS``, ``HEAD_SEGMENTS``: HF
   ``embed_tokens`` / ``lm_head``, Megatron ``word_embeddings`` / ``output_layer``, GPT-2 ``wte`` / ``wpe``) -> ``adamw``.
3. Other 2-D matrices (attention, MLP, MoE router and shared experts) and 3-D stacks (E, out, in) of experts ->
   ``matrix`` (Muon's orthogonalized update / SOAP's preconditioned update; a 3-D stack per expert).
4. Anything else (4-D and up) cannot be placed: a ``ValueError`` names the parameter.
Unnamed parameters (a plain list of tensors) follow the shape part of the rule only, so pass
``model.named_parameters()`` to send embeddings and the head to AdamW. Override with ``matrix_rule(name, shape)``
returning ``"matrix"``, ``"adamw"`` or ``None`` (= default), or per param group with ``{"algorithm": ...}``.

Fused weights are split before the matrix update (each part is its own matrix), by name segment:
- ``GateUpLayout``: gated-MLP [gate; up] stacked along the output dim: HF ``gate_up_proj`` (3-D experts
  (E, 2·I, H) in transformers 5.x) and Megatron ``linear_fc1`` (SwiGLU; register ``{"linear_fc1": None}`` for a
  non-gated MLP). On by default, switched by ``split_gate_up``.
- ``QKVLayout``: Megatron ``linear_qkv``, rows grouped per query group as [q heads of the group; k; v]; needs the
  head numbers, so pass ``fused_layouts={"linear_qkv": QKVLayout(...)}``; with ``split_qkv`` on and no layout given,
  a fused QKV weight is an error (never orthogonalized whole by accident). Q, K and V are each one matrix over all
  heads (Megatron-Core's convention).
- MLA projections of HF DeepseekV3 (``q_a_proj``, ``q_b_proj``, ``kv_a_proj_with_mqa``, ``kv_b_proj``, ``o_proj``) are
  separate parameters and get one matrix update each; nothing to split.
Under tensor parallelism the split applies to the local shard (Megatron shards [gate; up] and QKV per rank so that
each local part is a shard of the global part).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nemo_muon._validation import check_positive_int

MATRIX, ADAMW = "matrix", "adamw"
ROUTE_NAMES: tuple[str, ...] = (MATRIX, ADAMW)
EMBEDDING_SEGMENTS: frozenset[str] = frozenset({"embed_tokens", "word_embeddings", "embeddings", "embedding", "wte",
                                                "wpe", "tok_embeddings", "position_embeddings"})
HEAD_SEGMENTS: frozenset[str] = frozenset({"lm_head", "output_layer"})
FUSED_QKV_SEGMENTS: frozenset[str] = frozenset({"linear_qkv", "qkv_proj", "query_key_value"})

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


def default_matrix_rule(name: str | None, shape: Sequence[int]) -> str:
    """The documented default rule (module docstring): ``"matrix"`` or ``"adamw"``."""
    segments = set(name.split(".")) if name else set()
    if len(shape) <= 1 or segments & (EMBEDDING_SEGMENTS | HEAD_SEGMENTS):
        return ADAMW
    if len(shape) in (2, 3):
        return MATRIX
    raise ValueError(f"parameter {name or '<unnamed>'!r} with shape {tuple(shape)} cannot be placed by the routing "
                     "rule (allowed: 0-D/1-D -> adamw, 2-D matrices and 3-D expert stacks -> matrix update); "
                     "pass matrix_rule or a param group with 'algorithm'")


@dataclass(frozen=True)
class Route:
    """Where one parameter goes: ``algorithm`` and, for a fused matrix, how to split it (None = whole)."""

    algorithm: str
    layout: FusedLayout | None = None

    def split_sizes(self, name: str, rows: int) -> list[int] | None:
        """Row counts of the parts along dim -2 in the order they are stacked (QKV: per group), or None."""
        if self.layout is None:
            return None
        if isinstance(self.layout, GateUpLayout):
            return self.layout.split_sizes(name, rows)
        per_group = sum(self.layout.group_shapes())
        if rows % per_group:
            raise ValueError(f"fused QKV parameter {name!r} has {rows} rows, not a multiple of one query group's "
                             f"{per_group} rows (q, k, v = {self.layout.group_shapes()})")
        return self.layout.group_shapes()


def route_param(
    name: str | None,
    shape: Sequence[int],
    *,
    matrix_rule: MatrixRule | None = None,
    forced: str | None = None,
    layouts: Mapping[str, FusedLayout | None] = DEFAULT_FUSED_LAYOUTS,
    split_qkv: bool = True,
    split_gate_up: bool = True,
) -> Route:
    """Route one parameter: ``forced`` (param group) > ``matrix_rule`` > default rule; then its fused layout."""
    label = name or "<unnamed>"
    algorithm = forced
    if algorithm is None and matrix_rule is not None:
        algorithm = matrix_rule(name, tuple(shape))
    if algorithm is None:
        algorithm = default_matrix_rule(name, shape)
    if algorithm not in ROUTE_NAMES:
        raise ValueError(f"routing of parameter {label!r} must be one of {ROUTE_NAMES}; got {algorithm!r}")
    if algorithm == MATRIX and len(shape) not in (2, 3):
        raise ValueError(f"parameter {label!r} with shape {tuple(shape)} cannot take the matrix update "
                         "(allowed: 2-D matrices and 3-D expert stacks)")
    if algorithm == ADAMW or not name:
        return Route(algorithm)
    segments = name.split(".")
    for seg in reversed(segments):
        if seg in layouts and layouts[seg] is not None:
            layout = layouts[seg]
            if isinstance(layout, QKVLayout) and not split_qkv:
                return Route(algorithm)
            if isinstance(layout, GateUpLayout) and not split_gate_up:
                return Route(algorithm)
            route = Route(algorithm, layout)
            route.split_sizes(label, shape[-2])  # validate now, not at the first step
            if isinstance(layout, QKVLayout) and len(shape) != 2:
                raise ValueError(f"fused QKV parameter {label!r} must be 2-D; got shape {tuple(shape)}")
            return route
        if seg in FUSED_QKV_SEGMENTS and split_qkv:
            raise ValueError(f"parameter {label!r} is a fused QKV weight and split_qkv=True needs its layout: pass "
                             f"fused_layouts={{{seg!r}: QKVLayout(num_attention_heads=..., num_query_groups=..., "
                             "head_dim=...)}} or split_qkv=False")
    return Route(algorithm)
