"""Which data-parallel rank owns which matrix inside Megatron-Core's layer-wise optimizer, by Newton–Schulz cost.

Megatron-Core 0.16's `LayerWiseDistributedOptimizer.shard_params` sorts every parameter by numel and deals them out
ping-pong (``megatron/core/optimizer/layer_wise_optimizer.py``, ``shard_params``), which balances memory but not
the orthogonalization work: an (m, n) matrix costs ~ m²n + m³ Newton–Schulz FLOPs, not m·n. `ns_balanced_class`
returns a subclass whose ``shard_params`` places the matrix optimizer's parameters (ours: `MegatronMuon` /
`MegatronSoap`, the first optimizer) by LPT on the cost model of the torch backend's engine
(`nemo_muon.accounting.ownership.ns_cost` / ``soap_cost``), and Adam's parameters (near-free updates) ping-pong by numel as
Megatron does, each within its own domain (dense over ``dp_cp``, experts over ``expt_dp``). Everything else
(all-gather of the owned shards, master weights, checkpoints) is Megatron's, unchanged.

Megatron-Core 0.18+ takes ownership from a parameter layout computed when DDP is built
(``LayerWiseDistributedOptimizer.compute_full_param_layout``, called by ``megatron.training``'s
``wrap_model_chunks_with_ddp`` before any optimizer exists): the builder cannot choose it there, so 0.18+ keeps
Megatron's layout.
"""

from __future__ import annotations

import functools
from typing import Any

from nemo_muon.accounting.ownership import lpt_assign, ns_cost, ping_pong_assign, soap_cost
from nemo_muon.optim.muon import Muon
from nemo_muon.optim.soap import SOAP


def matrix_cost(optimizer: Muon | SOAP, shape: tuple[int, ...]) -> float:
    """Per-step update FLOPs of one matrix under our optimizer (SOAP's or Newton–Schulz's cost model)."""
    if isinstance(optimizer, SOAP):
        return soap_cost(shape, optimizer.defaults["precondition_frequency"])
    return ns_cost(shape, optimizer.defaults["ns_steps"])


@functools.cache
def ns_balanced_class() -> type:
    """Megatron-Core 0.16's `LayerWiseDistributedOptimizer` with ownership by NS cost (see the module doc)."""
    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer
    from megatron.core.utils import get_pg_rank, get_pg_size

    class NsBalancedLayerWiseOptimizer(LayerWiseDistributedOptimizer):
        """`LayerWiseDistributedOptimizer` whose matrices are owned by LPT on their update cost."""

        def shard_params(self, optimizers: list[Any]) -> None:
            pgs = self.pg_collection
            if get_pg_size(pgs.dp_cp) == 1:
                self.dp_cp_params_list = None
                self.expt_dp_params_list = None
                return
            groups = [(g, i == 0) for i, opt in enumerate(optimizers) for g in opt.param_groups]
            domains = {False: (pgs.dp_cp, []), True: (pgs.expt_dp, [])}  # is_expert_parallel -> (group, params)
            for index, (group, is_matrix) in enumerate(groups):
                for p in group["params"]:
                    domains[bool(group.get("is_expert_parallel", False))][1].append((p, index, is_matrix))
            kept: list[list[Any]] = [[] for _ in groups]
            lists = {}
            for expert, (pg, params) in domains.items():
                size, rank = get_pg_size(pg), get_pg_rank(pg)
                matrices = [x for x in params if x[2]]
                others = [x for x in params if not x[2]]
                matrix_owner = lpt_assign([matrix_cost(optimizers[0], tuple(p.shape)) for p, _, _ in matrices], size)
                other_owner = ping_pong_assign([p.numel() for p, _, _ in others], size)
                per_rank: list[list[Any]] = [[] for _ in range(size)]
                for (p, index, _), owner in [*zip(matrices, matrix_owner, strict=True),
                                             *zip(others, other_owner, strict=True)]:
                    per_rank[owner].append(p)
                    if owner == rank:
                        kept[index].append(p)
                lists[expert] = per_rank
            for (group, _), params in zip(groups, kept, strict=True):
                group["params"] = params
            self.dp_cp_params_list = lists[False]
            expert_lists = lists[True]
            self.expt_dp_params_list = (None if get_pg_size(pgs.expt_dp) == 1 or not any(expert_lists)
                                        else expert_lists)

    return NsBalancedLayerWiseOptimizer
