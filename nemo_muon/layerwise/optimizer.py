"""Layer-wise distributed optimizer: each data-parallel rank updates whole tensors it owns, then shares them.

Per step: grads are reduced to their owners (even-sized owner buckets, any backend), owners run the inner optimizer
(Muon / SOAP / AdamW) on fp32 master copies of the tensors they own, and the updated tensors are shared back. With
``collectives="reduce_scatter"`` (what ``auto`` picks except on gloo) that is a reduce-scatter and an all-gather; with
``"all_reduce"`` (``auto`` on gloo) an all-reduce and one broadcast per owner. With ``overlap_param_gather`` the sharing
runs asynchronously and each module waits for its own tensors in a forward pre-hook, so it hides in the next
forward. Ownership comes from `nemo_muon.accounting.ownership`
(LPT over preconditioner FLOPs, then bytes), computed identically on every rank. See docs/layerwise.md.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from nemo_muon._validation import check_choice, check_range, fail
from nemo_muon.accounting.ownership import METHODS, OwnershipPlan, PlanItem, ns_cost, plan_ownership, soap_cost
from nemo_muon.config.optimizer import NONFINITE_POLICIES
from nemo_muon.layerwise.buckets import COLLECTIVES, Bucket, build_buckets, resolve_collectives
from nemo_muon.layerwise.grad_hooks import GradReduceHooks
from nemo_muon.optim.routed import place_state_value

NamedParams = Sequence[tuple[str, torch.nn.Parameter]]
OptimizerFactory = Callable[[NamedParams], torch.optim.Optimizer]
STATE_FORMAT = "nemo_muon.layerwise/1"
_LOW_PRECISION = (torch.bfloat16, torch.float16)


def default_is_expert(name: str) -> bool:
    """Routed-expert tensors by name (Megatron ``.experts.`` / HF ``.experts.``)."""
    return ".experts." in name


def _is_matrix(name: str, p: torch.Tensor) -> bool:
    """Tensors Muon/SOAP precondition (the cost model only; the inner optimizer routes them itself)."""
    from nemo_muon.optim.routing import default_matrix_rule

    try:
        return default_matrix_rule(name, tuple(p.shape)) == "matrix"
    except ValueError:  # a shape no optimizer places: the inner optimizer raises with the details
        return False


def _group_rank_world(group: dist.ProcessGroup | None, field: str) -> tuple[int, int]:
    if group is None:
        return 0, 1
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError(f"{field} must contain this rank (global rank {dist.get_rank()}); it does not")
    return rank, dist.get_world_size(group)


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
        self._param_of = dict(named)
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
        for cat, group, field in categories:
            if not cat:
                continue
            rank, world = _group_rank_world(group, field)
            if check_replicas:
                _check_replicas(cat, group, field)
            plan = plan_ownership([self._item(n, p, optimizer) for n, p in cat], world, plan_method)
            self.plans.append(plan)
            self.collectives = resolve_collectives(collectives, group)
            for b in build_buckets(list(reversed(cat)), plan.owners, self.bucket_bytes, world, rank, group,
                                   self.collectives):
                self.buckets.append(b)
                for i in b.owned():
                    self.owned[b.names[i]] = (b, i)
        self.owned_names = [n for n in self.names if n in self.owned]
        self.masters: dict[str, torch.nn.Parameter] = {}
        for n in self.owned_names:
            p = self._param_of[n]
            use_master = master_weights and p.dtype in _LOW_PRECISION
            self.masters[n] = torch.nn.Parameter(p.detach().float().clone()) if use_master else p
        self.inner = self._build_inner(optimizer, [(n, self.masters[n]) for n in self.owned_names])
        self._inner_base_lrs = [g["lr"] for g in self.inner.param_groups] if self.inner is not None else []
        self._reference_lr = self._agreed_reference_lr(optimizer)
        self.param_groups[0]["lr"] = self._reference_lr
        self._reduced = False
        self._clip_coef = 1.0
        self._hooks = self._register_hooks(model) if overlap_param_gather else []
        self.grad_hooks = GradReduceHooks(self.buckets) if overlap_grad_reduce else None

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def _item(name: str, p: torch.Tensor, optimizer: Any) -> PlanItem:
        cost = 0.0
        if _is_matrix(name, p):
            if getattr(optimizer, "name", "") == "soap":
                cost = soap_cost(p.shape, getattr(optimizer, "precondition_frequency", 1))
            elif getattr(optimizer, "name", "") != "adamw":
                cost = ns_cost(p.shape, getattr(optimizer, "ns_steps", 5))
        return PlanItem(name, tuple(p.shape), cost, p.numel() * p.element_size())

    @staticmethod
    def _build_inner(optimizer: Any, named: list[tuple[str, torch.nn.Parameter]]) -> torch.optim.Optimizer | None:
        if not named:
            return None
        if callable(optimizer) and not hasattr(optimizer, "optimizer_kwargs"):
            return optimizer(named)
        from nemo_muon.optim import build_optimizer

        return build_optimizer(optimizer, named)

    def _register_hooks(self, model: torch.nn.Module) -> list[Any]:
        bucket_of = {id(b.params[i]): b for b in self.buckets for i in range(len(b.params))}
        hooks = []
        for module in model.modules():
            mine = {id(bucket_of[id(p)]): bucket_of[id(p)] for p in module.parameters(recurse=False)
                    if id(p) in bucket_of}
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
        agreed = float(self._all_reduce(local, dist.ReduceOp.MAX))
        if not math.isfinite(agreed) or agreed <= 0:
            raise fail("optimizer", optimizer, "a factory whose optimizer has a positive, finite lr on some rank")
        return agreed

    # ------------------------------------------------------------------ the step
    def finish_param_gather(self) -> None:
        """Wait for every outstanding param gather (called by step, state_dict and the forward pre-hooks)."""
        _finish(self.buckets)

    def reduce_gradients(self) -> None:
        """Reduce grads to owners (all buckets in flight at once); each owned master gets the DP-mean grad.
        Idempotent until step()."""
        if self._reduced:
            return
        self.finish_param_gather()
        for b in self.buckets:
            if not b.launched:  # not started by the backward hooks (overlap off, or a param got no grad)
                b.start_reduce()
        if self.grad_hooks is not None:
            self.grad_hooks.reset()
        for b in self.buckets:
            seg = b.finish_reduce()
            for i in b.owned():
                name, p = b.names[i], b.params[i]
                g = seg.narrow(0, b.offsets[i] - b.rank * b.seg_numel, p.numel()).view_as(p)
                master = self.masters[name]
                master.grad = g.to(master.dtype).div_(self.dp_size)
        self._reduced = True
        self._clip_coef = 1.0

    def _owned_grads(self) -> list[torch.Tensor]:
        return [self.masters[n].grad for n in self.owned_names if self.masters[n].grad is not None]

    def _all_reduce(self, t: torch.Tensor, op: dist.ReduceOp) -> torch.Tensor:
        if self.dp_group is not None:
            dist.all_reduce(t, op=op, group=self.dp_group)
        return t

    def _flats_are_global(self) -> bool:
        """True when every rank holds every reduced grad (all-reduce mode, one group): global checks need no
        collective (one sync point less per step; each costs milliseconds on a loaded gloo host)."""
        return self.collectives == "all_reduce" and self.expert_dp_group is None and self.dp_group is not None

    def global_grad_norm(self) -> float:
        """The L2 norm of the DP-mean gradient over all parameters (all ranks agree; after clipping: clipped)."""
        self.reduce_gradients()
        sq = torch.zeros((), dtype=torch.float64, device=self.comm_device)
        if self._flats_are_global():
            for b in self.buckets:
                sq += b.flat.detach().double().pow(2).sum()
            return math.sqrt(sq.item()) / self.dp_size * self._clip_coef
        for g in self._owned_grads():
            sq += g.detach().double().pow(2).sum()
        return math.sqrt(self._all_reduce(sq, dist.ReduceOp.SUM).item())

    def clip_grad_norm_(self, max_norm: float) -> float:
        """Scale grads so the global norm is at most ``max_norm`` (torch's rule); return the norm before."""
        check_range("max_norm", max_norm, low=0.0, low_inclusive=False)
        norm = self.global_grad_norm()
        coef = min(1.0, max_norm / (norm + 1e-6)) if math.isfinite(norm) else 1.0
        for g in self._owned_grads():
            g.mul_(coef)
        self._clip_coef *= coef
        return norm

    def _all_finite(self) -> bool:
        """True when no rank has a non-finite gradient: the checks stay on the device, one host read in all."""
        if self._flats_are_global():  # NaN/Inf survive the sum: every rank sees them in its reduced buffers
            flags = [torch.isfinite(b.flat).all() for b in self.buckets]
            return bool(torch.stack(flags).all()) if flags else True
        flags = [torch.isfinite(g).all().to(self.comm_device) for g in self._owned_grads()]
        bad = (~torch.stack(flags).all()).float() if flags else torch.zeros((), device=self.comm_device)
        return self._all_reduce(bad, dist.ReduceOp.MAX).item() == 0.0

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:
        """Reduce grads (if not done), skip on a non-finite grad anywhere, update owned tensors, share them."""
        if closure is not None:
            raise fail("closure", closure, "None (the layer-wise optimizer takes no closure)")
        self.reduce_gradients()
        self._reduced = False
        self.last_step_skipped = not self._all_finite()
        if self.last_step_skipped:
            if self.nonfinite == "raise":
                raise FloatingPointError("non-finite gradient on some data-parallel rank (nonfinite='raise')")
            self.skipped_steps += 1
            for m in self.masters.values():
                m.grad = None
            return
        if self.inner is not None:
            lr = self.param_groups[0]["lr"]
            for g, base in zip(self.inner.param_groups, self._inner_base_lrs, strict=True):
                g["lr"] = lr * (base / self._reference_lr)  # exactly lr for a group at the reference rate
            if hasattr(self.inner, "report_nonfinite"):  # nemo_muon optimizers: we checked globally above
                self.inner.step(skip_nonfinite_check=True)
            else:
                self.inner.step()
        for name in self.owned_names:
            b, i = self.owned[name]
            master, p = self.masters[name], b.params[i]
            if master is not p:
                p.copy_(master)
            b.view_of(i).copy_(p)
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
        if self.grad_hooks is not None:
            self.grad_hooks.remove()
            self.grad_hooks = None

    def no_sync(self) -> contextlib.AbstractContextManager[None]:
        """With ``overlap_grad_reduce``: backward inside this block starts no reduction (gradient accumulation:
        all micro-batches but the last). Without it: a no-op."""
        return self.grad_hooks.no_sync() if self.grad_hooks is not None else contextlib.nullcontext()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the model's grads and the masters' grads (draining reductions started by a backward)."""
        for b in self.buckets:
            if b.launched:
                b.finish_reduce()
        if self.grad_hooks is not None:
            self.grad_hooks.reset()
        super().zero_grad(set_to_none=set_to_none)
        for m in self.masters.values():
            m.grad = None
        self._reduced = False

    # ------------------------------------------------------------------ state
    def comm_bytes_per_step(self) -> int:
        """Bytes this rank sends per step for grads and params (ring model, see ``Bucket.comm_bytes``)."""
        return sum(b.comm_bytes() for b in self.buckets)

    def gather_wait_s(self) -> float:
        """Total seconds blocked waiting for param sharing so far (the part of the gathers not hidden)."""
        return sum(b.wait_s for b in self.buckets)

    def state_bytes(self) -> int:
        """Bytes of optimizer state (and separate master weights) held by this rank."""
        total = sum(m.numel() * m.element_size() for n, m in self.masters.items() if m is not self._param_of[n])
        if self.inner is not None:
            for st in self.inner.state.values():
                total += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
        return total

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard, keyed by parameter name (merge the shards of all ranks to load at any DP size)."""
        self.finish_param_gather()
        state: dict[str, dict[str, Any]] = {}
        for n in self.owned_names:
            st = self.inner.state.get(self.masters[n], {}) if self.inner is not None else {}
            state[n] = {k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in st.items()}
        masters = {n: m.detach().clone() for n, m in self.masters.items() if m is not self._param_of[n]}
        group = self.param_groups[0]
        return {"format": STATE_FORMAT, "names": list(self.names), "owned": list(self.owned_names),
                "state": state, "masters": masters, "skipped_steps": self.skipped_steps,
                "lr": group["lr"], "initial_lr": group.get("initial_lr")}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a (merged) state dict: every name this rank owns must be present; unknown names are an error."""
        if state_dict.get("format") != STATE_FORMAT:
            raise fail("state_dict['format']", state_dict.get("format"), repr(STATE_FORMAT))
        unknown = sorted(set(state_dict["state"]) - set(self.names))
        if unknown:
            raise ValueError(f"state_dict has parameters this model lacks: {unknown[:10]}")
        missing = [n for n in self.owned_names if n not in state_dict["state"]]
        if missing:
            raise ValueError(f"state_dict lacks optimizer state for parameters owned here: {missing[:10]}")
        self.finish_param_gather()
        with torch.no_grad():
            for n in self.owned_names:
                master, p = self.masters[n], self._param_of[n]
                if master is not p:
                    src = state_dict["masters"].get(n, p)
                    master.copy_(src)
                if self.inner is not None:
                    st = state_dict["state"][n]
                    self.inner.state[master] = {k: place_state_value(k, v, master.device) for k, v in st.items()}
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))
        self.param_groups[0]["lr"] = state_dict["lr"]
        if state_dict.get("initial_lr") is not None:
            self.param_groups[0]["initial_lr"] = state_dict["initial_lr"]


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
