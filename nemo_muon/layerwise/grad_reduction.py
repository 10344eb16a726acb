"""Gradient reduction of the whole-tensor optimizer: grads to their owners, then the global questions asked of them.

One `GradientReduction` per whole-tensor optimizer: ``reduce`` brings every owned master its DP-mean gradient (the buckets' reduce,
started by the backward hooks with ``overlap_grad_reduce`` or here), once per step; ``global_norm``, ``clip`` and
``all_finite`` answer for the gradient of the whole model, so every rank agrees. In all-reduce mode over one group
every rank already holds every reduced gradient, so they need no collective; otherwise one scalar all-reduce over
the DP group each (the expert-DP group is a subgroup of it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.distributed as dist

from nemo_muon._validation import check_range
from nemo_muon.layerwise.buckets import Bucket
from nemo_muon.layerwise.grad_hooks import GradReduceHooks


class GradientReduction:
    """Reduces the buckets' gradients into the owned masters and answers for the global gradient (module doc)."""

    def __init__(self, buckets: Sequence[Bucket], masters: dict[str, torch.nn.Parameter], *,
                 dp_group: dist.ProcessGroup | None, dp_size: int, global_flats: bool, comm_device: torch.device,
                 overlap: bool) -> None:
        self.buckets = list(buckets)
        self.masters = masters
        self.dp_group = dp_group
        self.dp_size = dp_size
        self.global_flats = global_flats
        """Every rank holds every reduced grad (all-reduce mode, one group): global checks need no collective."""
        self.comm_device = comm_device
        self.hooks: GradReduceHooks | None = GradReduceHooks(self.buckets) if overlap else None
        """Backward hooks that start each bucket's reduce as soon as its grads are ready (``overlap``)."""
        self.reduced = False
        self.clip_coef = 1.0

    def reduce(self) -> None:
        """Reduce grads to owners (all buckets in flight at once); each owned master gets the DP-mean grad.
        Idempotent until `reset`."""
        if self.reduced:
            return
        for b in self.buckets:
            if not b.launched:  # not started by the backward hooks (overlap off, or a param got no grad)
                b.start_reduce()
        if self.hooks is not None:
            self.hooks.reset()
        for b in self.buckets:
            seg = b.finish_reduce()
            for i in b.owned():
                g = seg.narrow(0, b.offsets[i] - b.rank * b.seg_numel, b.numel_of(i)).view(b.view_of(i).shape)
                master = self.masters[b.names[i]]
                master.grad = g.to(master.dtype).div_(self.dp_size)
        self.reduced = True
        self.clip_coef = 1.0

    def drain(self) -> None:
        """Finish reductions a backward started (before grads are cleared) and forget the reduced step."""
        for b in self.buckets:
            if b.launched:
                b.finish_reduce()
        if self.hooks is not None:
            self.hooks.reset()
        self.reduced = False

    def reset(self) -> None:
        """The next step reduces anew."""
        self.reduced = False

    def owned_grads(self) -> list[torch.Tensor]:
        return [m.grad for m in self.masters.values() if m.grad is not None]

    def _all_reduce(self, t: torch.Tensor, op: dist.ReduceOp) -> torch.Tensor:
        if self.dp_group is not None:
            dist.all_reduce(t, op=op, group=self.dp_group)
        return t

    def global_norm(self) -> float:
        """The L2 norm of the DP-mean gradient over all parameters (all ranks agree; after clipping: clipped)."""
        self.reduce()
        sq = torch.zeros((), dtype=torch.float64, device=self.comm_device)
        if self.global_flats:
            for b in self.buckets:
                sq += b.flat.detach().double().pow(2).sum()
            return math.sqrt(sq.item()) / self.dp_size * self.clip_coef
        for g in self.owned_grads():
            sq += g.detach().double().pow(2).sum()
        return math.sqrt(self._all_reduce(sq, dist.ReduceOp.SUM).item())

    def clip(self, max_norm: float) -> float:
        """Scale grads so the global norm is at most ``max_norm`` (torch's rule); return the norm before."""
        check_range("max_norm", max_norm, low=0.0, low_inclusive=False)
        norm = self.global_norm()
        coef = min(1.0, max_norm / (norm + 1e-6)) if math.isfinite(norm) else 1.0
        for g in self.owned_grads():
            g.mul_(coef)
        self.clip_coef *= coef
        return norm

    def all_finite(self) -> bool:
        """True when no rank has a non-finite gradient: the checks stay on the device, one host read in all."""
        if self.global_flats:  # NaN/Inf survive the sum: every rank sees them in its reduced buffers
            flags = [torch.isfinite(b.flat).all() for b in self.buckets]
            return bool(torch.stack(flags).all()) if flags else True
        flags = [torch.isfinite(g).all().to(self.comm_device) for g in self.owned_grads()]
        bad = (~torch.stack(flags).all()).float() if flags else torch.zeros((), device=self.comm_device)
        return self._all_reduce(bad, dist.ReduceOp.MAX).item() == 0.0
