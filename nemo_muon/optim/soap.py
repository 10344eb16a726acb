"""SOAP: Adam in the eigenbasis of Shampoo's Kronecker factors (Vyas et al., arXiv 2409.11321), with AdamW for
1-D params, embeddings and the head (the routing rule of ``nemo_muon.optim.routing``).

Per matrix-routed parameter G (2-D, or a 3-D expert stack: every expert its own factors, batched):
    first step: L = G·Gᵀ, R = Gᵀ·G, Q_L, Q_R = eigenvectors (torch.linalg.eigh, by decreasing eigenvalue), and no
    weight update (as in the SOAP reference code): in the eigenbasis of its own factors G is diagonal, and Adam's
    elementwise m/sqrt(v) would turn float rounding noise off the diagonal into ±1 entries.
    later steps (t counts them from 1): G' = Q_Lᵀ G Q_R;  m <- m.lerp(G', 1-β1);  v <- β2 v + (1-β2) G'²
    (both moments live in the eigenbasis, so m/sqrt(v) is computed from one rotation of G and stays bounded)
    update = Q_L [ (m / (1-β1^t)) / (sqrt(v / (1-β2^t)) + eps) ] Q_Rᵀ;  p <- p·(1 - lr·wd) - lr·update
    L <- L.lerp(G·Gᵀ, 1-shampoo_beta); R likewise
    every ``precondition_frequency`` steps: refresh Q by one power-iteration step + QR (Q <- qr(L·Q)), after sorting
    Q's columns by the estimated eigenvalues diag(Qᵀ L Q) and permuting v to match; m is rotated into the new basis.
``precondition_frequency`` is honoured (emerging-optimizers 0.3.0 refreshes every step; Megatron-Core drops the
field); the AdamW-routed params do update on the first step.
Tensor parallelism: with ``tp_group`` set, a Megatron-style TP shard (``tensor_model_parallel``, ``partition_dim``) is
gathered, preconditioned as the full matrix (state is full-size on every TP rank) and the own slice of the update is
applied, so results do not depend on the TP size (a row-sharded fused [gate; up] is regrouped into its global
layout first). Fused weights are preconditioned whole (no split).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from nemo_muon.config.optimizer import SoapConfig
from nemo_muon.optim.muon import tensor_partition_dim
from nemo_muon.optim.routed import MatrixItem, RoutedOptimizer
from nemo_muon.optim.routing import GateUpLayout, MatrixRule

_CONFIG_FIELDS = frozenset(f.name for f in dataclasses.fields(SoapConfig) if f.init)
SOAP_GROUP_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(SoapConfig)
                                           if f.init and f.name not in ("nonfinite", "engine"))
"""`SoapConfig`'s fields a param group may set."""
NOT_BUILT_STEP = -1.0
"""``state["step"]`` of a placeholder state: the preconditioner is built at the next step."""


def init_soap_state(state: dict[str, Any], shape: tuple[int, ...], device: torch.device) -> None:
    """Fill an empty per-parameter state with SOAP's tensors (zeros, step -1) for a (full) matrix of ``shape``: what
    a checkpoint load needs to exist before it copies the saved tensors in; a fresh run builds it at its first step."""
    if state:
        return
    m, n = shape[-2], shape[-1]
    batch = tuple(shape[:-2])
    state["step"] = torch.tensor(NOT_BUILT_STEP)
    state["L"], state["Q_L"] = (torch.zeros(*batch, m, m, device=device) for _ in range(2))
    state["R"], state["Q_R"] = (torch.zeros(*batch, n, n, device=device) for _ in range(2))
    state["exp_avg"], state["exp_avg_sq"] = (torch.zeros(*shape, device=device) for _ in range(2))


def _eigenbasis(factor: torch.Tensor) -> torch.Tensor:
    """Eigenvectors of a symmetric PSD (batched) matrix, by decreasing eigenvalue."""
    _, vecs = torch.linalg.eigh(factor)
    return vecs.flip(-1)


def _refresh(factor: torch.Tensor, q: torch.Tensor, v: torch.Tensor, v_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One power-iteration + QR refresh of eigenbasis ``q`` of ``factor``; returns (new q, v permuted to match)."""
    est = torch.diagonal(q.mT @ factor @ q, dim1=-2, dim2=-1)
    order = est.argsort(dim=-1, descending=True)
    q = torch.gather(q, -1, order.unsqueeze(-2).expand_as(q))
    index = order.unsqueeze(-1) if v_dim == -2 else order.unsqueeze(-2)
    v = torch.gather(v, v_dim, index.expand_as(v))
    q, _ = torch.linalg.qr(factor @ q)
    return q, v


class SOAP(RoutedOptimizer):
    """SOAP for hidden matrices (module docstring), AdamW (same betas / eps) for embeddings, head, 1-D params.

    ``params`` as `nemo_muon.Muon`'s (the model, named parameters or param groups; ``routes()``). Keyword names
    equal ``SoapConfig``'s fields; ``tp_group``, ``matrix_rule`` and ``master_weights`` are runtime
    extras. ``step``, ``has_nonfinite_grads``, ``last_step_skipped`` / ``skipped_steps`` as in ``nemo_muon.Muon``.
    """

    label = "SOAP"
    registry_name = "soap"
    """The optimizer's entry in `nemo_muon.registry`."""

    def __init__(
        self,
        params: Iterable[Any] | torch.nn.Module,
        lr: float,
        weight_decay: float = SoapConfig.weight_decay,
        *,
        betas: tuple[float, float] = SoapConfig.betas,
        shampoo_beta: float = SoapConfig.shampoo_beta,
        eps: float = SoapConfig.eps,
        precondition_frequency: int = SoapConfig.precondition_frequency,
        nonfinite: str = SoapConfig.nonfinite,
        tp_group: dist.ProcessGroup | None = None,
        matrix_rule: MatrixRule | None = None,
        master_weights: bool = False,
    ) -> None:
        # the config's fields, named once (the signature) and validated once (SoapConfig: raises naming the field)
        given = {k: v for k, v in locals().items() if k in _CONFIG_FIELDS}
        config = SoapConfig(**{**given, "betas": tuple(betas)})
        self.tp_group = tp_group
        self._group_fields = SOAP_GROUP_FIELDS
        defaults = {k: getattr(config, k) for k in SOAP_GROUP_FIELDS}
        defaults.update(adamw_betas=config.betas, adamw_eps=config.eps)  # the AdamW part: SOAP's betas and eps
        super().__init__(params, defaults, nonfinite=nonfinite, master_weights=master_weights,
                         matrix_rule=matrix_rule, fused_layouts=None, split_qkv=False, split_gate_up=True,
                         adamw_lr=None)

    def placeholder_state(self, p: torch.Tensor) -> None:
        """The state a checkpoint load copies into (Megatron's state init hook): full-size factors under TP."""
        world = 1 if self.tp_group is None else dist.get_world_size(self.tp_group)
        shape = list(p.shape)
        pdim = tensor_partition_dim(p) if world > 1 else None
        if pdim is not None:
            shape[pdim] *= world
        init_soap_state(self.state[p], tuple(shape), p.device)

    def _validate_group(self, group: dict[str, Any]) -> None:
        SoapConfig(**{k: tuple(group[k]) if k == "betas" else group[k] for k in self._group_fields})

    def _full_grad(self, item: MatrixItem) -> tuple[torch.Tensor, int | None, bool]:
        """The gathered global gradient, the partition dim (-2/-1) and whether it is a row-sharded [gate; up]
        (Megatron shards each half, so rank r holds [gate_r; up_r] and the halves are regrouped here)."""
        pdim = tensor_partition_dim(item.param) if self.tp_group is not None else None
        if pdim is None or dist.get_world_size(self.tp_group) == 1:
            return item.grad, None, False
        pdim = pdim - item.grad.ndim if pdim >= 0 else pdim
        shards = [torch.empty_like(item.grad) for _ in range(dist.get_world_size(self.tp_group))]
        dist.all_gather(shards, item.grad.contiguous(), group=self.tp_group)
        halves = isinstance(item.route.layout, GateUpLayout) and pdim == -2
        if halves:
            pairs = [s.chunk(2, dim=-2) for s in shards]
            return torch.cat([g for g, _ in pairs] + [u for _, u in pairs], dim=-2), pdim, True
        return torch.cat(shards, dim=pdim), pdim, False

    def _matrix_updates(self, items: list[MatrixItem]) -> list[torch.Tensor | None]:
        updates: list[torch.Tensor | None] = []
        for it in items:
            grad, pdim, halves = self._full_grad(it)
            update = self._soap_direction(grad, it.state, it.group)
            if update is not None and pdim is not None:
                world, rank = dist.get_world_size(self.tp_group), dist.get_rank(self.tp_group)
                if halves:
                    update = torch.cat([h.chunk(world, dim=-2)[rank] for h in update.chunk(2, dim=-2)], dim=-2)
                else:
                    update = update.chunk(world, dim=pdim)[rank]
            updates.append(update)
        return updates

    @staticmethod
    def _soap_direction(g: torch.Tensor, state: dict[str, Any], group: dict[str, Any]) -> torch.Tensor | None:
        b1, b2 = group["betas"]
        gg_l, gg_r = g @ g.mT, g.mT @ g
        # first step (no state yet, or the placeholder state `init_soap_state` creates for a checkpoint load, whose
        # step is -1): build the preconditioner only (see the module docstring)
        done = int(state["step"].item()) if "L" in state else int(NOT_BUILT_STEP)  # one host read per step
        if done < 0:
            state["step"] = torch.tensor(0.0)
            state["L"], state["R"] = gg_l, gg_r
            state["Q_L"], state["Q_R"] = _eigenbasis(gg_l), _eigenbasis(gg_r)
            state["exp_avg"] = torch.zeros_like(g)
            state["exp_avg_sq"] = torch.zeros_like(g)
            return None
        state["step"] += 1
        t = done + 1
        q_l, q_r = state["Q_L"], state["Q_R"]
        g_rot = q_l.mT @ g @ q_r
        state["exp_avg"].lerp_(g_rot, 1 - b1)
        state["exp_avg_sq"].mul_(b2).addcmul_(g_rot, g_rot, value=1 - b2)
        denom = (state["exp_avg_sq"] / (1 - b2**t)).sqrt_().add_(group["eps"])
        update = q_l @ (state["exp_avg"] / (1 - b1**t) / denom) @ q_r.mT
        sb = group["shampoo_beta"]
        state["L"].lerp_(gg_l, 1 - sb)
        state["R"].lerp_(gg_r, 1 - sb)
        if t % group["precondition_frequency"] == 0:
            new_l, state["exp_avg_sq"] = _refresh(state["L"], q_l, state["exp_avg_sq"], -2)
            new_r, state["exp_avg_sq"] = _refresh(state["R"], q_r, state["exp_avg_sq"], -1)
            state["exp_avg"] = (new_l.mT @ q_l) @ state["exp_avg"] @ (q_r.mT @ new_r)
            state["Q_L"], state["Q_R"] = new_l, new_r
        return update
