"""Layer-wise distributed optimizer: each data-parallel rank updates whole tensors it owns, then shares them.

Per step: grads are reduced to their owners (even-sized owner buckets, any backend), owners run the inner optimizer
(Muon / SOAP / AdamW) on fp32 master copies of the tensors they own, and the updated tensors are shared back. With
``collectives="reduce_scatter"`` (what ``auto`` picks except on gloo) that is a reduce-scatter and an all-gather; with
``"all_reduce"`` (``auto`` on gloo) an all-reduce and one broadcast per owner. With ``overlap_param_gather`` the sharing
runs asynchronously and each module waits for its own tensors in a forward pre-hook, so it hides in the next
forward. With Muon's ``ns_split_target`` the largest matrices are split: each member of an aligned block of DP ranks
owns one slice (``pieces``), the slices are reduced and shared through the buckets like whole tensors, and the
block's members run the matrix's Newton–Schulz together (Muon in ``tp_mode="distributed"`` over the block's group).

The whole-tensor optimizer coordinates its parts: `ownership` (the plan of `plan_items`: LPT over the update FLOPs of what the inner
optimizer runs, then bytes, computed identically on every rank; buckets, owned tensors, masters), `grad_reduction`
(grads to their owners, the global norm, clipping, the non-finite check), `owned_update` (the inner optimizers at
the scheduled rate, the result written back and shared) and `state_format` (state dicts). See docs/layerwise.md.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from nemo_muon._validation import check_choice, check_range, fail
from nemo_muon.accounting.ownership_plan import METHODS, OwnershipPlan
from nemo_muon.config.optimizer import NONFINITE_POLICIES
from nemo_muon.layerwise.buckets import COLLECTIVES, Bucket
from nemo_muon.layerwise.grad_reduction import GradientReduction
from nemo_muon.layerwise.owned_update import OwnedUpdate
from nemo_muon.layerwise.ownership import NamedParams, SplitMember, build_ownership, group_rank_world
from nemo_muon.layerwise.state_format import load_shard_state, shard_state

OptimizerFactory = Callable[[NamedParams], torch.optim.Optimizer]


def default_is_expert(name: str) -> bool:
    """Routed-expert tensors by name (Megatron ``.experts.`` / HF ``.experts.``)."""
    return ".experts." in name


class WholeTensorOptimizer(torch.optim.Optimizer):
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
        self.dp_rank, self.dp_size = group_rank_world(dp_group, "dp_group")
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
        own = build_ownership(named, optimizer, dp_group=dp_group, expert_dp_group=expert_dp_group,
                              is_expert=is_expert, plan_method=plan_method, collectives=collectives,
                              bucket_bytes=self.bucket_bytes, master_weights=master_weights,
                              check_replicas=check_replicas)
        self.plans: list[OwnershipPlan] = own.plans
        """The ownership plans (`nemo_muon.layerwise.ownership`): dp_group's, then expert_dp_group's."""
        self.buckets: list[Bucket] = own.buckets
        self.owned: dict[str, tuple[Bucket, int]] = own.owned
        self.splits: dict[str, SplitMember] = own.splits
        """Split matrices this rank is a member of, by parameter name."""
        self.collectives = own.collectives
        self.owned_names = own.owned_names
        """Whole parameters this rank owns (model order); its slices of split matrices are in ``split_keys``."""
        self.split_keys = own.split_keys
        self.masters: dict[str, torch.nn.Parameter] = own.masters
        self.update = OwnedUpdate(optimizer, own, self.names, dp_group=dp_group, comm_device=self.comm_device)
        """Steps the inner optimizers on the owned masters and shares the result."""
        self.inner = self.update.inner
        self.split_inners = self.update.split_inners
        self.split_inner_of = self.update.split_inner_of
        """The inner optimizer of each of this rank's slice keys (one Muon per block)."""
        self.param_groups[0]["lr"] = self.update.reference_lr
        self.gradients = GradientReduction(
            self.buckets, self.masters, dp_group=dp_group, dp_size=self.dp_size, comm_device=self.comm_device,
            global_flats=self.collectives == "all_reduce" and expert_dp_group is None and dp_group is not None,
            overlap=overlap_grad_reduce)
        """Reduces the grads to their owners; the global norm, clipping and the non-finite check."""
        self._hooks = self._register_hooks(model) if overlap_param_gather else []

    # ------------------------------------------------------------------ construction helpers
    @property
    def state_names(self) -> list[str]:
        """Names whose optimizer state this rank loads: its whole parameters and the split matrices it is in."""
        return [n for n in self.names if n in self.owned or n in self.splits]

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
        self.update.apply(self.param_groups[0]["lr"])
        self.update.share()
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

