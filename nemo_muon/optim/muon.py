"""Muon: momentum, orthogonalized by Newton–Schulz, for hidden matrices; AdamW for the rest, in one optimizer.

Per matrix-routed parameter (decoupled weight decay first, as in torch.optim.AdamW):
    m <- m.lerp(g, 1 - momentum);  u <- g.lerp(m, momentum) if nesterov else m
    for each part P of u (fused weights split: QKV, gate/up; 3-D expert stacks: per expert, one batched NS):
        O = NS(P) * scale(out, in) * extra_scale_factor
    p <- p·(1 - lr·wd) - lr·O
Scale modes, with (out, in) the part's *global* shape (local shard shape in blockwise TP mode):
match_rms_adamw 0.2·sqrt(max(out, in)) (the default, `MuonConfig.scale_mode`: AdamW's lr carries over);
spectral sqrt(max(out, in)) (Megatron's); shape_scaling sqrt(max(1, out/in)); unit_rms_norm sqrt(out/in).
Tensor parallelism: with ``tp_group`` set, a parameter with ``tensor_model_parallel=True`` and ``partition_dim``
attributes (Megatron's convention) is a shard; its NS runs in ``tp_mode`` (see ``nemo_muon.optim.ns_iteration``), all
matrices of one step together so distributed-mode collectives are fused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nemo_muon._validation import check_positive_int
from nemo_muon.config.optimizer import SCALE_MODES, MuonConfig
from nemo_muon.optim.coefficients import coefficient_table
from nemo_muon.optim.fused import merge_parts, split_parts
from nemo_muon.optim.muon_batched import batched_step
from nemo_muon.optim.ns_iteration import gather_shards, newton_schulz_many
from nemo_muon.optim.ns_stacks import STACK_BYTES
from nemo_muon.optim.routed import MatrixItem, RoutedOptimizer
from nemo_muon.optim.routing import FusedLayout, MatrixRule
from nemo_muon.optim.split_exchange import gather_slices, scatter_slices


def muon_scale(out_dim: int, in_dim: int, mode: str) -> float:
    """The update scale of a (out_dim, in_dim) matrix for ``scale_mode`` (module docstring)."""
    if mode == "spectral":
        return math.sqrt(max(out_dim, in_dim))
    if mode == "shape_scaling":
        return math.sqrt(max(1.0, out_dim / in_dim))
    if mode == "unit_rms_norm":
        return math.sqrt(out_dim / in_dim)
    if mode == "match_rms_adamw":
        return 0.2 * math.sqrt(max(out_dim, in_dim))
    raise ValueError(f"muon.scale_mode must be one of {SCALE_MODES}; got {mode!r}")


def tensor_partition_dim(p: torch.Tensor) -> int | None:
    """The TP partition dim of a Megatron-style parameter (``tensor_model_parallel`` + ``partition_dim``), or None."""
    if not getattr(p, "tensor_model_parallel", False):
        return None
    return getattr(p, "partition_dim", None)


def newton_schulz_stacked(xs: list[torch.Tensor], steps: int, coefficients: str, *,
                          precision: str) -> list[torch.Tensor]:
    """NS of every matrix of ``xs`` (2-D or 3-D stacks, no TP), the matrices of one shape stacked into one batched
    call (``newton_schulz_many(..., stack=True)``): the same result as one call per matrix within fp32 rounding
    (batched GEMMs may sum in another order). A shape met once runs as it is. On a GPU in bf16 a stack gives up the
    SYRK kernel (2-D only) for fewer launches."""
    return newton_schulz_many(xs, steps, coefficients, precision=precision, stack=True)


_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(MuonConfig) if f.init)
MUON_GROUP_FIELDS: tuple[str, ...] = tuple(
    f.name for f in dataclasses.fields(MuonConfig)
    if f.init and f.name not in ("split_qkv", "split_gate_up", "nonfinite", "tp_mode", "engine", "ns_split_target"))
"""`MuonConfig`'s fields a param group may set (the others are the optimizer's: routing, policy, TP mode, and the
layer-wise optimizers' and the megatron backend's)."""


@dataclass(frozen=True)
class SplitShare:
    """This rank's share of a whole matrix whose Newton–Schulz an aligned block of data-parallel ranks runs
    together (`Muon.share_split`): member ``index`` of ``group``'s ``ways`` ranks orthogonalizes slice ``index``
    along ``dim`` of every part (Megatron's TP shard convention), and the block all-gathers the slices."""

    group: dist.ProcessGroup
    index: int
    ways: int
    dim: int
    first_holds: bool = False
    """Only the block's first member holds the matrix (its reduced gradient, momentum and master: Megatron-Core
    >= 0.18's reduce-scatter layout): it scatters the NS input's slices and gathers the orthogonalized ones
    (`nemo_muon.optim.split_exchange`); the other members hold no copy and only help (their ``share_split`` names
    the model's parameter, which their optimizer routes but does not step). False: every member holds the matrix
    whole with the same gradient and all-gather the update (Megatron-Core 0.16's all-reduce)."""


class Muon(RoutedOptimizer):
    """Muon for hidden matrices and 3-D expert stacks, AdamW for embeddings, head, norms and biases.

    ``params``: the model (``nn.Module``: routed by what each parameter is), ``model.named_parameters()`` (the name
    rule), or param-group dicts (a group may force ``"algorithm": "matrix" | "adamw"``); plain unnamed matrices are
    refused (``nemo_muon.optim.routed``); ``routes()`` prints where each went and why. Keyword names equal
    ``MuonConfig``'s fields; ``matrix_rule``, ``fused_layouts`` (see ``nemo_muon.optim.routing``) and
    ``master_weights`` (fp32 master copy for bf16/fp16 params) are runtime extras, and so are ``batch_ns`` and
    ``stack_bytes``: with ``batch_ns`` (the default) the matrices of a step that share their group, shape, route and
    TP partition dim are stacked (at most ``stack_bytes`` of fp32 input per stack, `nemo_muon.optim.ns_stacks`), one
    Newton–Schulz operator per stack, and the element-wise work is multi-tensor (`nemo_muon.optim.muon_batched`): no
    operator per matrix, every update within fp32 reordering of the per-matrix one; ``batch_ns=False`` runs one
    matrix at a time (peak memory: one extra momentum-sized tensor). Muon's variants with state of their own
    (`MuonVariant`) stack their NS and keep their element-wise work per matrix.
    ``step(closure=None, *, skip_nonfinite_check=False)``; after a step ``last_step_skipped`` tells whether a
    non-finite gradient skipped it (``skipped_steps`` counts them).
    """

    label = "Muon"
    registry_name = "muon"
    """The optimizer's entry in `nemo_muon.registry` (a subclass with its own update names its own)."""
    splits_fused = True

    def __init__(
        self,
        params: Iterable[Any] | torch.nn.Module,
        lr: float,
        weight_decay: float = MuonConfig.weight_decay,
        *,
        momentum: float = MuonConfig.momentum,
        nesterov: bool = MuonConfig.nesterov,
        ns_steps: int = MuonConfig.ns_steps,
        coefficients: str = MuonConfig.coefficients,
        scale_mode: str = MuonConfig.scale_mode,
        extra_scale_factor: float = MuonConfig.extra_scale_factor,
        ns_precision: str = MuonConfig.ns_precision,
        split_qkv: bool = MuonConfig.split_qkv,
        split_gate_up: bool = MuonConfig.split_gate_up,
        adamw_betas: tuple[float, float] = MuonConfig.adamw_betas,
        adamw_eps: float = MuonConfig.adamw_eps,
        adamw_lr: float | None = MuonConfig.adamw_lr,
        nonfinite: str = MuonConfig.nonfinite,
        tp_group: dist.ProcessGroup | None = None,
        tp_mode: str = MuonConfig.tp_mode,
        matrix_rule: MatrixRule | None = None,
        fused_layouts: Mapping[str, FusedLayout | Mapping | None] | None = None,
        master_weights: bool = False,
        batch_ns: bool = True,
        stack_bytes: int = STACK_BYTES,
    ) -> None:
        # the config's fields, named once (the signature) and validated once (MuonConfig: raises naming the field)
        given = {k: v for k, v in locals().items() if k in _CONFIG_FIELDS}
        config = MuonConfig(**{**given, "adamw_betas": tuple(adamw_betas)})
        self._group_fields = MUON_GROUP_FIELDS
        self.tp_group = tp_group
        self.tp_mode = tp_mode
        self.batch_ns = bool(batch_ns)
        check_positive_int("stack_bytes", stack_bytes)
        self.stack_bytes = stack_bytes
        defaults = {k: getattr(config, k) for k in MUON_GROUP_FIELDS if k != "adamw_lr"}  # the base adds adamw_lr
        super().__init__(
            params, defaults, nonfinite=nonfinite, master_weights=master_weights, matrix_rule=matrix_rule,
            fused_layouts=fused_layouts, split_qkv=split_qkv, split_gate_up=split_gate_up, adamw_lr=adamw_lr,
        )
        self._splits: dict[torch.Tensor, SplitShare] = {}

    def share_split(self, p: torch.Tensor, share: SplitShare) -> None:
        """Run ``p``'s Newton–Schulz with the other members of ``share.group``: every member holds ``p`` whole with the
        same gradient (``share.first_holds`` False), or the first member alone holds it and the others help
        (`SplitShare.first_holds`; a helper names the parameter its optimizer routes but does not step). All members
        step together. The result equals the whole matrix's NS within fp32 rounding, at 1/ways of the m²n FLOPs per
        member plus the Gram all-reduces and the exchange of slices (``ns_split``)."""
        if self._routes.get(p) is None or self._routes[p].algorithm == "adamw" or p.dim() != 2:
            raise ValueError(f"share_split: parameter {self._names.get(p)!r} must be a 2-D matrix of this optimizer")
        if self.tp_group is not None:
            raise ValueError("share_split needs tp_group=None (a split inside a tensor-parallel shard is not "
                             "supported)")
        if p.shape[share.dim] % share.ways:
            raise ValueError(f"share_split: dim {share.dim} of {self._names.get(p)!r} {tuple(p.shape)} must divide "
                             f"into ways={share.ways} equal slices")
        self._splits[p] = share

    def move_split(self, old: torch.Tensor, new: torch.Tensor) -> None:
        """Carry a split share over when a wrapper replaces a parameter (e.g. by its fp32 master copy)."""
        if old in self._splits:
            self._splits[new] = self._splits.pop(old)

    def split_share(self, p: torch.Tensor) -> SplitShare | None:
        """``p``'s split share, or None when this rank orthogonalizes it alone."""
        return self._splits.get(p)

    def _validate_group(self, group: dict[str, Any]) -> None:
        config = MuonConfig(**{k: tuple(group[k]) if k == "adamw_betas" else group[k] for k in self._group_fields})
        coefficient_table(config.coefficients, field=f"{config.name}.coefficients")  # in the installed package

    def _matrix_updates(self, items: list[MatrixItem]) -> list[torch.Tensor | None]:
        """With ``batch_ns``, `batched_step` (applied there: None for those items); otherwise, without TP, one
        parameter at a time (peak memory: one extra momentum-sized tensor), with TP all together so that their
        collectives are fused. Split matrices (``share_split``) together, after the others, with the ones this rank
        helps with."""
        split = [it for it in items if it.param in self._splits]
        whole = [it for it in items if it.param not in self._splits]
        out: list[torch.Tensor | None]
        if self.batch_ns and self._element_wise_is_muons() and whole:
            batched_step(whole, partition_dim=self._partition_dim, tp_group=self.tp_group, tp_mode=self.tp_mode,
                         scale=muon_scale, stack_bytes=self.stack_bytes, apply=self._apply_items)
            out = [None] * len(whole)
        elif self.tp_group is None and not self.batch_ns:
            out = [u for it in whole for u in self._orthogonalized([it])]
        else:
            out = self._orthogonalized(whole) if whole else []
        helped = self._helped(split)
        if not split and not helped:
            return out
        by_param = dict(zip((it.param for it in whole), out, strict=True))
        by_param.update(zip((it.param for it in split), self._split_orthogonalized(split, helped), strict=True))
        return [by_param[it.param] for it in items]

    def _element_wise_is_muons(self) -> bool:
        """Whether this class keeps Muon's NS input and post-NS step (a variant with state of its own does not)."""
        cls = type(self)
        return cls._ns_input is Muon._ns_input and cls._post_orthogonalize is Muon._post_orthogonalize

    def _partition_dim(self, p: torch.Tensor) -> int | None:
        return tensor_partition_dim(p) if self.tp_group is not None else None

    def _apply_items(self, items: list[MatrixItem], updates: list[torch.Tensor], scales: list[float]) -> None:
        self._apply_many([(it.param, it.state, u, it.group["lr"], it.group["weight_decay"])
                          for it, u in zip(items, updates, strict=True)], scales)

    def takes_part_without_updates(self) -> bool:
        """Whether this rank must step even without a matrix of its own to update: it helps orthogonalize a matrix
        another member holds (`SplitShare.first_holds`)."""
        return any(s.first_holds and s.index > 0 for s in self._splits.values())

    def _helped(self, split: list[MatrixItem]) -> list[torch.Tensor]:
        """The parameters this rank helps with (held by their block's first member); raises for a held split matrix
        without a gradient (its helpers would wait for it)."""
        stepped = {it.param for it in split}
        held = {id(q) for g in self.param_groups for q in g["params"]}
        helped = []
        for p, share in self._splits.items():
            if share.first_holds and share.index > 0:
                if p in stepped:
                    raise RuntimeError(f"split matrix {self._names.get(p)!r}: member {share.index} of its block steps "
                                       "it, but only the first member holds it (first_holds)")
                helped.append(p)
            elif p not in stepped and share.first_holds and id(p) in held:
                raise RuntimeError(f"split matrix {self._names.get(p)!r} has no gradient this step; the other members "
                                   "of its block would wait for it")
        return helped

    @staticmethod
    def _ns_input(it: MatrixItem) -> list[torch.Tensor]:
        """Momentum step, then the NS input (Nesterov look-ahead or the buffer) split into its fused parts."""
        g = it.group
        if "momentum_buffer" not in it.state:
            it.state["momentum_buffer"] = torch.zeros_like(it.grad)
        buf = it.state["momentum_buffer"]
        buf.lerp_(it.grad, 1 - g["momentum"])
        u = it.grad.lerp(buf, g["momentum"]) if g["nesterov"] else buf
        return split_parts(u, it.route, it.name)

    def _split_orthogonalized(self, items: list[MatrixItem], helped: list[torch.Tensor]) -> list[torch.Tensor]:
        """Each member orthogonalizes its slice of every part (distributed NS over the block), then the block
        all-gathers the slices (every member gets the whole, identical update), or, where the first member alone
        holds the matrix, it scatters the slices and gathers them back. Blocks run in the order of their first
        matrix by name, matrices by name, so every member issues the same collectives in the same order."""
        entries = sorted([(self._names[it.param], it.param, it) for it in items]
                         + [(self._names[p], p, None) for p in helped], key=lambda e: e[0])
        parts: list[list[torch.Tensor] | None] = []
        shapes: list[list[torch.Size]] = []
        for name, p, it in entries:
            ps = self._ns_input(it) if it is not None else None
            parts.append(ps)
            shapes.append([t.shape for t in (ps if ps is not None else split_parts(p.detach(), self._routes[p], name))])
        outs: list[list[torch.Tensor | None]] = [[None] * len(s) for s in shapes]
        keys: dict[tuple, list[int]] = {}
        for i, (_, p, it) in enumerate(entries):
            share = self._splits[p]
            g = it.group if it is not None else self._group_of(p)
            keys.setdefault((share.group, share.ways, share.index, share.dim, share.first_holds, g["ns_steps"],
                             g["coefficients"], g["ns_precision"]), []).append(i)
        for (group, ways, index, dim, first_holds, steps, coeffs, precision), idx in keys.items():
            where = [(i, j) for i in idx for j in range(len(shapes[i]))]
            if first_holds:
                wholes = [parts[i][j] for i, j in where] if index == 0 else None
                device = entries[idx[0]][1].device
                slices = scatter_slices(wholes, [shapes[i][j] for i, j in where], [dim] * len(where), group,
                                        dtype=torch.float32, device=device)
            else:
                slices = [parts[i][j].chunk(ways, dim=dim)[index].contiguous() for i, j in where]
            ys = newton_schulz_many(slices, steps, coeffs, tp_group=group, tp_mode="distributed",
                                    partition_dims=[dim] * len(slices), precision=precision, stack=self.batch_ns,
                                    stack_bytes=self.stack_bytes)
            full = (gather_slices(ys, [dim - 2] * len(ys), group) if first_holds
                    else gather_shards(ys, [dim - 2] * len(ys), group))
            for (i, j), y in zip(where, full or [], strict=False):
                outs[i][j] = y
        by_param = {p: self._scaled_update(it, outs[i], [(y.shape[-2], y.shape[-1]) for y in outs[i]])
                    for i, (_, p, it) in enumerate(entries) if it is not None}
        return [by_param[it.param] for it in items]

    def _group_of(self, p: torch.Tensor) -> dict[str, Any]:
        """The param group a routed parameter was given in (a helped one is no longer in the groups it is stepped
        from: its NS settings are the defaults')."""
        for g in self.param_groups:
            if any(p is q for q in g["params"]):
                return g
        return self.defaults

    def _orthogonalized(self, items: list[MatrixItem]) -> list[torch.Tensor]:
        world = 1 if self.tp_group is None else dist.get_world_size(self.tp_group)
        # 1. momentum and NS input per param, split into parts
        parts = [self._ns_input(it) for it in items]
        # 2. NS for all parts with the same NS settings together (TP collectives fused)
        outs: list[list[torch.Tensor | None]] = [[None] * len(ps) for ps in parts]
        keys: dict[tuple, list[tuple[int, int]]] = {}
        for i, it in enumerate(items):
            g = it.group
            key = (g["ns_steps"], g["coefficients"], g["ns_precision"])
            keys.setdefault(key, []).extend((i, j) for j in range(len(parts[i])))
        for (steps, coeffs, precision), where in keys.items():
            dims = [tensor_partition_dim(items[i].param) if self.tp_group is not None else None for i, _ in where]
            ys = newton_schulz_many(
                [parts[i][j] for i, j in where], steps, coeffs, tp_group=self.tp_group, tp_mode=self.tp_mode,
                partition_dims=dims, precision=precision, stack=self.batch_ns, stack_bytes=self.stack_bytes,
            )
            for (i, j), y in zip(where, ys, strict=True):
                outs[i][j] = y
        # 3. scale each part by its (global) shape, merge
        updates = []
        for i, it in enumerate(items):
            pdim = tensor_partition_dim(it.param) if self.tp_group is not None else None
            shapes = []
            for y in outs[i]:
                shape = [y.shape[-2], y.shape[-1]]
                if pdim is not None and self.tp_mode != "blockwise":
                    shape[pdim - y.ndim if pdim >= 0 else pdim] *= world
                shapes.append((shape[0], shape[1]))
            updates.append(self._scaled_update(it, outs[i], shapes))
        return updates

    def _scaled_update(self, it: MatrixItem, ys: list[torch.Tensor], shapes: list[tuple[int, int]]) -> torch.Tensor:
        """The parts' orthogonalized outputs, each through `_post_orthogonalize` and scaled by its (global) shape,
        merged into the parameter's update."""
        g = it.group
        if it.route.transposed:  # stored (in, out): HF Conv1D
            shapes = [(in_, out) for out, in_ in shapes]
        scaled = [self._post_orthogonalize(it, j, y) * (muon_scale(out, in_, g["scale_mode"]) * g["extra_scale_factor"])
                  for j, (y, (out, in_)) in enumerate(zip(ys, shapes, strict=True))]
        return merge_parts(scaled, it.route, it.grad)

    def _post_orthogonalize(self, it: MatrixItem, part: int, y: torch.Tensor) -> torch.Tensor:
        """What happens to part ``part`` of ``it`` between Newton–Schulz and the scale: nothing for Muon (NorMuon
        normalizes it)."""
        return y

    def placeholder_state(self, p: torch.Tensor) -> None:
        """The state a checkpoint load copies into (Megatron's state init hook): the momentum buffer."""
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p, dtype=torch.float32)
