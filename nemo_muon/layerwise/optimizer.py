"""Layer-wise distributed optimizer: each data-parallel rank updates whole tensors it owns, then shares them.

Per step: grads are reduced to their owners (even-sized owner buckets, any backend), owners run the inner optimizer
(Muon / SOAP / AdamW) on fp32 master copies of the tensors they own, and the updated tensors are shared back. With
``collectives="reduce_scatter"`` (what ``auto`` picks except on gloo) that is a reduce-scatter and an all-gather; with
``"all_reduce"`` (``auto`` on gloo) an all-reduce and one broadcast per owner. With ``overlap_param_gather`` the sharing
runs asynchronously and each module waits for its own tensors in a forward pre-hook, so it hides in the next
forward. Ownership comes from `nemo_muon.layerwise.plan_items` (LPT over the update FLOPs of what the inner
optimizer runs, then bytes), computed identically on every rank. With Muon's ``ns_split_target`` the largest
matrices are split: each member of an aligned block of DP ranks owns one slice (``pieces``), the slices are reduced
and shared through the buckets like whole tensors, and the block's members run the matrix's Newton–Schulz together
(Muon in ``tp_mode="distributed"`` over the block's group). See docs/layerwise.md.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nemo_muon._validation import check_choice, check_range, fail
from nemo_muon.accounting.ownership import METHODS, OwnershipPlan
from nemo_muon.config.optimizer import NONFINITE_POLICIES, MuonConfig
from nemo_muon.layerwise.buckets import COLLECTIVES, Bucket, Entry, build_buckets, resolve_collectives
from nemo_muon.layerwise.grad_reduction import GradientReduction
from nemo_muon.layerwise.pieces import Piece, make_piece
from nemo_muon.layerwise.plan_items import engine_plan, matrix_route
from nemo_muon.layerwise.split_groups import block_groups
from nemo_muon.layerwise.state_format import load_shard_state, shard_state

NamedParams = Sequence[tuple[str, torch.nn.Parameter]]
OptimizerFactory = Callable[[NamedParams], torch.optim.Optimizer]
_LOW_PRECISION = (torch.bfloat16, torch.float16)


def default_is_expert(name: str) -> bool:
    """Routed-expert tensors by name (Megatron ``.experts.`` / HF ``.experts.``)."""
    return ".experts." in name


def _group_rank_world(group: dist.ProcessGroup | None, field: str) -> tuple[int, int]:
    if group is None:
        return 0, 1
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{field} must contain this rank (global rank {dist.get_rank()}); it does not")
    return rank, dist.get_world_size(group)


@dataclass(frozen=True)
class SplitMember:
    """This rank's part in a split matrix: every member's slice (member order), the block's group, its own key."""

    pieces: list[Piece]
    group: dist.ProcessGroup
    key: str
    """The bucket / master key of this rank's slice (``_piece_key``)."""
    index: int


def _piece_key(name: str, index: int, ways: int) -> str:
    return f"{name}[split {index}/{ways}]"


class LayerWiseDistributedOptimizer(torch.optim.Optimizer):
    """Wrap Muon / SOAP / AdamW so each rank of ``dp_group`` updates only the whole tensors it owns.

    ``optimizer`` is a config (`MuonConfig`, `SoapConfig`, `AdamWConfig`) or a factory ``named_params -> Optimizer``.
    Expert tensors (``is_expert(name)``) are owned and reduced within ``expert_dp_group`` (a subgroup of
    ``dp_group``) when one is given. ``param_groups[0]['lr']`` is the absolute learning rate applied at the next
    step (an LR scheduler drives it, in torch's idiom): the inner optimizer's groups get it, each times its own
    ratio to the reference rate at construction (the config's ``lr``; for a factory, the largest group lr of the
    inner optimizers, agreed over ``dp_group``), so a single-rate inner optimizer applies exactly this rate and
    Muon's AdamW part keeps its ``adamw_lr`` ratio. ``dp_group=None`` runs locally with no communication.
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any, *, dp_group: dist.ProcessGroup | None,
                 expert_dp_group: dist.ProcessGroup | None = None, is_expert: Callable[[str], bool] = default_is_expert,
                 overlap_param_gather: bool = False, bucket_size_mb: float = 25.0, master_weights: bool = True,
                 plan_method: str = "lpt", nonfinite: str | None = None, check_replicas: bool = True,
                 collectives: str = "auto", overlap_grad_reduce: bool = False) -> None:
        check_range("bucket_size_mb", bucket_size_mb, low=0.0, low_inclusive=False)
        check_choice("collectives", collectives, COLLECTIVES)
        check_choice("plan_method", plan_method, METHODS)
        nonfinite = getattr(optimizer, "nonfinite", "skip") if nonfinite is None else nonfinite
        check_choice("nonfinite", nonfinite, NONFINITE_POLICIES)
        self.dp_group = dp_group
        self.dp_rank, self.dp_size = _group_rank_world(dp_group, "dp_group")
        self.expert_dp_group = expert_dp_group
        self.overlap_param_gather = overlap_param_gather
        self.bucket_bytes = max(1, int(bucket_size_mb * 2**20))
        self.nonfinite = nonfinite
        self.skipped_steps = 0
        self.last_step_skipped = False
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise fail("model", type(model).__name__, "a module with trainable parameters")
        self.names = [n for n, _ in named]
        self.params_by_name = dict(named)
        """Every trainable parameter by name (model order)."""
        self.comm_device = named[0][1].device  # of the scalars all-reduced in global checks (NCCL: no CPU tensors)
        super().__init__([p for _, p in named], {"lr": float(getattr(optimizer, "lr", 0.0))})  # factory: set below
        categories: list[tuple[NamedParams, dist.ProcessGroup | None, str]] = [(named, dp_group, "dp_group")]
        if expert_dp_group is not None:
            experts = [(n, p) for n, p in named if is_expert(n)]
            categories = [([(n, p) for n, p in named if not is_expert(n)], dp_group, "dp_group"),
                          (experts, expert_dp_group, "expert_dp_group")]
        self.plans: list[OwnershipPlan] = []
        self.buckets: list[Bucket] = []
        self.owned: dict[str, tuple[Bucket, int]] = {}
        self.splits: dict[str, SplitMember] = {}
        """Split matrices this rank is a member of, by parameter name."""
        for cat, group, field in categories:
            if not cat:
                continue
            rank, world = _group_rank_world(group, field)
            if check_replicas:
                _check_replicas(cat, group, field)
            plan = engine_plan(cat, world, optimizer, plan_method, split=field == "dp_group" and world > 1)
            self.plans.append(plan)
            self.collectives = resolve_collectives(collectives, group)
            entries, owners = self._entries(list(reversed(cat)), plan, optimizer, group, rank)
            for b in build_buckets(entries, owners, self.bucket_bytes, world, rank, group, self.collectives):
                self.buckets.append(b)
                for i in b.owned():
                    self.owned[b.names[i]] = (b, i)
        self.owned_names = [n for n in self.names if n in self.owned]
        """Whole parameters this rank owns (model order); its slices of split matrices are in ``split_keys``."""
        self.split_keys = [self.splits[n].key for n in self.names if n in self.splits]
        self.masters: dict[str, torch.nn.Parameter] = {}
        for n in self.owned_names:
            p = self.params_by_name[n]
            use_master = master_weights and p.dtype in _LOW_PRECISION
            self.masters[n] = torch.nn.Parameter(p.detach().float().clone()) if use_master else p
        for key in self.split_keys:  # a slice is a tensor of its own (fp32 with master weights), a TP shard for Muon
            b, i = self.owned[key]
            p = b.params[i]
            dtype = torch.float32 if master_weights and p.dtype in _LOW_PRECISION else p.dtype
            master = torch.nn.Parameter(b.pieces[i].read(p.detach()).to(dtype))
            master.tensor_model_parallel = True
            master.partition_dim = b.pieces[i].dim
            self.masters[key] = master
        self.inner = self._build_inner(optimizer, [(n, self.masters[n]) for n in self.owned_names])
        self.split_inners = self._build_split_inners(optimizer)
        self._inner_base_lrs = [g["lr"] for g in self.inner.param_groups] if self.inner is not None else []
        self._reference_lr = self._agreed_reference_lr(optimizer)
        self.param_groups[0]["lr"] = self._reference_lr
        self.gradients = GradientReduction(
            self.buckets, self.masters, dp_group=dp_group, dp_size=self.dp_size, comm_device=self.comm_device,
            global_flats=self.collectives == "all_reduce" and expert_dp_group is None and dp_group is not None,
            overlap=overlap_grad_reduce)
        """Reduces the grads to their owners; the global norm, clipping and the non-finite check."""
        self._hooks = self._register_hooks(model) if overlap_param_gather else []

    # ------------------------------------------------------------------ construction helpers
    def _entries(self, named: NamedParams, plan: OwnershipPlan, optimizer: Any, group: dist.ProcessGroup | None,
                 rank: int) -> tuple[list[Entry], dict[str, int]]:
        """Bucket entries in ``named``'s order: whole parameters, and one slice per member of each split matrix."""
        entries: list[Entry] = []
        owners: dict[str, int] = {}
        groups = block_groups(plan, group, rank) if plan.splits and group is not None else {}
        for n, p in named:
            sp = plan.splits.get(n)
            if sp is None:
                entries.append((n, p, None))
                owners[n] = plan.owners[n]
                continue
            route = matrix_route(n, tuple(p.shape), optimizer)
            pieces = [make_piece(n, tuple(p.shape), route, sp.option.dim, j, sp.option.ways)
                      for j in range(sp.option.ways)]
            for j, (r, piece) in enumerate(zip(sp.ranks, pieces, strict=True)):
                key = _piece_key(n, j, sp.option.ways)
                entries.append((key, p, piece))
                owners[key] = r
            if rank in sp.ranks:
                j = sp.ranks.index(rank)
                self.splits[n] = SplitMember(pieces, groups[sp.ranks], _piece_key(n, j, sp.option.ways), j)
        return entries, owners

    def _build_split_inners(self, optimizer: Any) -> list[torch.optim.Optimizer]:
        """One Muon per block this rank is in, over its slices: ``tp_mode="distributed"`` over the block's group."""
        from nemo_muon.optim import build_optimizer

        by_group: dict[Any, list[tuple[str, torch.nn.Parameter]]] = {}
        for n in self.names:
            if n in self.splits:
                by_group.setdefault(self.splits[n].group, []).append((n, self.masters[self.splits[n].key]))
        if by_group and not isinstance(optimizer, MuonConfig):
            raise fail("optimizer", type(optimizer).__name__, "a MuonConfig to split matrices (ns_split_target)")
        inners = [build_optimizer(optimizer, named, tp_group=g, tp_mode="distributed") for g, named in by_group.items()]
        self.split_inner_of = {self.splits[n].key: inner for inner, (_, named) in zip(inners, by_group.items(),
                                                                                        strict=True) for n, _ in named}
        return inners

    @property
    def state_names(self) -> list[str]:
        """Names whose optimizer state this rank loads: its whole parameters and the split matrices it is in."""
        return [n for n in self.names if n in self.owned or n in self.splits]

    @staticmethod
    def _build_inner(optimizer: Any, named: list[tuple[str, torch.nn.Parameter]]) -> torch.optim.Optimizer | None:
        if not named:
            return None
        if callable(optimizer) and not hasattr(optimizer, "optimizer_kwargs"):
            return optimizer(named)
        from nemo_muon.optim import build_optimizer

        return build_optimizer(optimizer, named)

    def _register_hooks(self, model: torch.nn.Module) -> list[Any]:
        buckets_of: dict[int, list[Bucket]] = {}
        for b in self.buckets:
            for p in b.params:
                buckets_of.setdefault(id(p), []).append(b)
        hooks = []
        for module in model.modules():
            mine = {id(b): b for p in module.parameters(recurse=False) for b in buckets_of.get(id(p), [])}
            if mine:
                waits = list(mine.values())
                hooks.append(module.register_forward_pre_hook(lambda _m, _a, waits=waits: _finish(waits)))
        return hooks

    def _agreed_reference_lr(self, optimizer: Any) -> float:
        """The rate ``param_groups[0]['lr']`` starts at and the inner rates are ratios to: a config's ``lr``; for a
        factory the largest initial group lr of the inner optimizers of all ranks (one all-reduce: a rank that
        owns nothing has no inner optimizer to read)."""
        if hasattr(optimizer, "optimizer_kwargs"):
            return float(optimizer.lr)
        local = torch.tensor(max(self._inner_base_lrs, default=-math.inf), dtype=torch.float64,
                             device=self.comm_device)
        if self.dp_group is not None:
            dist.all_reduce(local, op=dist.ReduceOp.MAX, group=self.dp_group)
        agreed = float(local)
        if not math.isfinite(agreed) or agreed <= 0:
            raise fail("optimizer", optimizer, "a factory whose optimizer has a positive, finite lr on some rank")
        return agreed

    # ------------------------------------------------------------------ the step
    def finish_param_gather(self) -> None:
        """Wait for every outstanding param gather (called by step, state_dict and the forward pre-hooks)."""
        _finish(self.buckets)

    @property
    def grad_hooks(self) -> Any:
        """The backward hooks that start the reduce early (``overlap_grad_reduce``), or None."""
        return self.gradients.hooks

    def reduce_gradients(self) -> None:
        """Reduce grads to owners; each owned master gets the DP-mean grad. Idempotent until step()."""
        self.finish_param_gather()
        self.gradients.reduce()

    def global_grad_norm(self) -> float:
        """The L2 norm of the DP-mean gradient over all parameters (all ranks agree; after clipping: clipped)."""
        self.finish_param_gather()
        return self.gradients.global_norm()

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Scale grads so the global norm is at most ``max_norm`` (torch's rule); return the norm before."""
        self.finish_param_gather()
        return self.gradients.clip(max_norm)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        """Reduce grads (if not done), skip on a non-finite grad anywhere, update owned tensors, share them."""
        if closure is not None:
            raise fail("closure", closure, "None (the layer-wise optimizer takes no closure)")
        self.reduce_gradients()
        self.gradients.reset()
        self.last_step_skipped = not self.gradients.all_finite()
        if self.last_step_skipped:
            if self.nonfinite == "raise":
                raise FloatingPointError("non-finite gradient on some data-parallel rank (nonfinite='raise')")
            self.skipped_steps += 1
            for m in self.masters.values():
                m.grad = None
            return
        lr = self.param_groups[0]["lr"]
        if self.inner is not None:
            for g, base in zip(self.inner.param_groups, self._inner_base_lrs, strict=True):
                g["lr"] = lr * (base / self._reference_lr)  # exactly lr for a group at the reference rate
            if hasattr(self.inner, "report_nonfinite"):  # nemo_muon optimizers: we checked globally above
                self.inner.step(skip_nonfinite_check=True)
            else:
                self.inner.step()
        for inner in self.split_inners:  # a config's Muon: every group at the config's lr, the reference rate
            for g in inner.param_groups:
                g["lr"] = lr
            inner.step(skip_nonfinite_check=True)
        for name in self.owned_names:
            b, i = self.owned[name]
            master, p = self.masters[name], b.params[i]
            if master is not p:
                p.copy_(master)
            b.view_of(i).copy_(p)
        for key in self.split_keys:
            b, i = self.owned[key]
            b.pieces[i].write(b.params[i], self.masters[key])
            b.read_into_flat(i, b.params[i])
        for b in reversed(self.buckets):  # buckets are in backward order: share the first layers first
            b.start_gather()
        if not self.overlap_param_gather:
            self.finish_param_gather()

    def remove_hooks(self) -> None:
        """Finish pending communication and detach the forward pre-hooks and grad hooks from the model."""
        self.finish_param_gather()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if self.gradients.hooks is not None:
            self.gradients.hooks.remove()
            self.gradients.hooks = None

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """With ``overlap_grad_reduce``: backward inside this block starts no reduction (gradient accumulation:
        all micro-batches but the last). Without it: a no-op."""
        return self.grad_hooks.no_sync() if self.grad_hooks is not None else contextlib.nullcontext()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's grads and the masters' grads (draining reductions started by a backward)."""
        self.gradients.drain()
        super().zero_grad(set_to_none=set_to_none)
        for m in self.masters.values():
            m.grad = None

    # ------------------------------------------------------------------ state
    def comm_bytes_per_step(self) -> int:
        """Bytes this rank sends per step for grads and params (ring model, see ``Bucket.comm_bytes``)."""
        return sum(b.comm_bytes() for b in self.buckets)

    def gather_wait_s(self) -> float:
        """Total seconds blocked waiting for param sharing so far (the part of the gathers not hidden)."""
        return sum(b.wait_s for b in self.buckets)

    def state_bytes(self) -> int:
        """Bytes of optimizer state (and separate master weights) held by this rank."""
        total = sum(m.numel() * m.element_size() for n, m in self.masters.items() if m is not self.params_by_name.get(n))
        for inner in ([self.inner] if self.inner is not None else []) + self.split_inners:
            for st in inner.state.values():
                total += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
        return total

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard, keyed by parameter name (`nemo_muon.layerwise.state_format.shard_state`)."""
        return shard_state(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a (merged) state dict (`nemo_muon.layerwise.state_format.load_shard_state`)."""
        load_shard_state(self, state_dict)


def _finish(buckets: Sequence[Bucket]) -> None:
    for b in buckets:
        b.finish_gather()


def _check_replicas(named: NamedParams, group: dist.ProcessGroup | None, field: str) -> None:
    """Raise on every rank if any parameter differs across ``group`` (fingerprints compared by all-reduce)."""
    if group is None or dist.get_world_size(group) == 1:
        return
    fps = []
    device = named[0][1].device  # NCCL all-reduces device tensors only
    for _, p in named:
        x = p.detach().reshape(-1).double()
        w = torch.arange(x.numel(), dtype=torch.float64, device=x.device).remainder_(7).add_(1)
        fps.append(torch.stack([x.sum(), (x * x).sum(), (x * w).sum()]).to(device))
    fp = torch.stack(fps)
    both = torch.cat([fp, -fp])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    hi, lo = both[: len(fps)], -both[len(fps):]
    differ = [named[i][0] for i in range(len(fps)) if not torch.equal(hi[i], lo[i])]
    if differ:
        raise ValueError(f"parameters differ across the ranks of {field} at construction (initialize them "
                         f"identically, e.g. same seed or a broadcast): {differ[:10]}")
