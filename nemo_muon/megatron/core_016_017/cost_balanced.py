"""Which data-parallel rank owns which matrix inside Megatron-Core's layer-wise optimizer, by Newton–Schulz cost.

Megatron-Core 0.16's `LayerWiseDistributedOptimizer.shard_params` sorts every parameter by numel and deals them out
ping-pong (``megatron/core/optimizer/layer_wise_optimizer.py``, ``shard_params``), which balances memory but not
the orthogonalization work: an (m, n) matrix costs ~ m²n + m³ Newton–Schulz FLOPs, not m·n. `ns_balanced_class`
returns a subclass whose ``shard_params`` places the matrix optimizer's parameters (ours: `MegatronMuon` /
`MegatronSOAP`, the first optimizer) by LPT on the cost model of its registry entry (``spec.matrix``, the one the
torch backend's engine and the planner use), and Adam's parameters (near-free updates) by LPT on their numel from
the elements each rank's matrices hold (Megatron deals them out by numel alone), so that every rank owns about as
many bytes, which is what a gradient reduced to its owners sends (`nemo_muon.megatron.core_016_017.owner_reduce`), each within
its own domain (experts over ``expt_dp`` first, then the dense matrices over ``dp_cp``,
starting from the expert work each rank already has, as ``nemo-muon plan`` models it). Everything else
(all-gather of the owned shards, master weights, checkpoints) is Megatron's, unchanged.

Split ownership (``MuonConfig.ns_split_target``, 0.16 / 0.17, Muon, TP = 1): the dense matrices are planned by
`nemo_muon.accounting.ownership_plan.plan_ownership` with a balance target, exactly as the whole-tensor optimizer plans them
(``accounting.ns_split``, counting the extra all-gather of the update). A split matrix stays whole in the optimizer
of every member of its block (each holds the fp32 master and the momentum, and receives the full reduced gradient: DDP's
all-reduce gives it every rank by default, `nemo_muon.megatron.core_016_017.owner_reduce` all-reduces it over the block
with ``optimizer.collectives=reduce_scatter``); our Muon runs its Newton–Schulz distributed over the block
(`Muon.share_split`), so every member computes the identical update; the block's first rank shares the parameter in Megatron's all-gather. The
gradient norm and zero count skip the other members' copies, and their checkpoint tensors are marked as replicas.

Megatron-Core 0.18+ takes ownership from a parameter layout computed when DDP is built
(``LayerWiseDistributedOptimizer.compute_full_param_layout``, called by ``megatron.training``'s
``wrap_model_chunks_with_ddp`` before any optimizer exists): there the same plan is laid out by
`nemo_muon.megatron.core_018_plus.cost_layout` (a split matrix held by its block's first rank only).
"""

from __future__ import annotations

import functools
from typing import Any

from nemo_muon.accounting.ownership_plan import lpt_assign, plan_ownership
from nemo_muon.megatron.shared.engine import megatron_leaves, ours_in
from nemo_muon.megatron.shared.ownership import expert_work, is_routed_expert, matrix_item
from nemo_muon.optim.muon import Muon, SplitShare
from nemo_muon.registry import spec_named


@functools.cache
def ns_balanced_class() -> type:
    """Megatron-Core 0.16's `LayerWiseDistributedOptimizer` with ownership by NS cost (see the module doc)."""
    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer
    from megatron.core.utils import get_pg_rank, get_pg_size

    class NsBalancedLayerWiseOptimizer(LayerWiseDistributedOptimizer):
        """`LayerWiseDistributedOptimizer` whose matrices are owned by LPT on their update cost, the largest split
        over blocks of DP ranks with ``split_target`` (module doc)."""

        def __init__(self, optimizers: list[Any], config: Any, pg_collection: Any = None,
                     init_state_fn_list: list[Any] | None = None, *, split_target: float | None = None) -> None:
            self.split_target = split_target
            self.split_plan: Any = None
            self.dense_plan: Any = None
            """The dense matrices' `OwnershipPlan` over dp_cp (``flops`` include each rank's expert work)."""
            self.expert_plan: Any = None
            """The routed experts' `OwnershipPlan` over expt_dp (both plans keyed by the matrix optimizer's names)."""
            self.split_holders: dict[int, tuple[int, ...]] = {}
            """id of a split matrix -> the dp_cp ranks of its block (each holds a copy and reads its gradient)."""
            super().__init__(optimizers, config, pg_collection, init_state_fn_list)

        def shard_params(self, optimizers: list[Any]) -> None:
            pgs = self.pg_collection
            if get_pg_size(pgs.dp_cp) == 1:
                self.dp_cp_params_list = None
                self.expt_dp_params_list = None
                return
            matrix_opt = optimizers[0]
            split = (self.split_target is not None and spec_named(matrix_opt.registry_name).matrix.splittable
                     and matrix_opt.tp_group is None)
            groups = [(g, i == 0) for i, opt in enumerate(optimizers) for g in opt.param_groups]
            domains = {False: (pgs.dp_cp, []), True: (pgs.expt_dp, [])}  # is_expert_parallel -> (group, params)
            for index, (group, is_matrix) in enumerate(groups):
                for p in group["params"]:
                    domains[bool(group.get("is_expert_parallel", False))][1].append((p, index, is_matrix))
            kept: list[list[Any]] = [[] for _ in groups]
            lists = {}
            expert_flops: list[float] = []
            for expert in (True, False):  # experts first: the dense plan starts from each rank's expert work
                pg, params = domains[expert]
                size, rank = get_pg_size(pg), get_pg_rank(pg)
                matrices = [x for x in params if x[2]]
                others = [x for x in params if not x[2]]
                target = self.split_target if split and not expert else None
                keys = [matrix_opt.name_of(p) or f"matrix {k}" for k, (p, _, _) in enumerate(matrices)]
                items = [matrix_item(matrix_opt, p, key, target is not None and not is_routed_expert(key))
                         for key, (p, _, _) in zip(keys, matrices, strict=True)]
                initial = None if expert else expert_work(expert_flops, pgs, size, rank)
                plan = plan_ownership(items, size, "lpt", initial_flops=initial, balance_target=target)
                if expert:
                    expert_flops = list(plan.flops)
                    self.expert_plan = plan
                else:
                    self.dense_plan = plan
                if target is not None:
                    self.split_plan = plan
                    self._share_splits(matrix_opt, plan, keys, [p for p, _, _ in matrices], pg, rank)
                per_rank: list[list[Any]] = [[] for _ in range(size)]
                for key, (p, index, _) in zip(keys, matrices, strict=True):
                    sp = plan.splits.get(key)
                    per_rank[plan.owners[key]].append(p)  # the block's first rank shares it
                    if sp is not None:
                        self.split_holders[id(p)] = tuple(sp.ranks)
                    if (sp is not None and rank in sp.ranks) or (sp is None and plan.owners[key] == rank):
                        kept[index].append(p)
                matrix_numel = [sum(p.numel() for p in params) for params in per_rank]
                other_owner = lpt_assign([p.numel() for p, _, _ in others], size, initial_loads=matrix_numel)
                for (p, index, _), owner in zip(others, other_owner, strict=True):
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

        @staticmethod
        def _share_splits(muon: Muon, plan: Any, keys: list[str], params: list[Any], pg: Any, rank: int) -> None:
            from nemo_muon.layerwise.split_groups import every_block_group

            blocks = every_block_group(pg, rank)  # alike on every rank (pipeline stages split differently)
            for key, p in zip(keys, params, strict=True):
                sp = plan.splits.get(key)
                if sp is not None and rank in sp.ranks:
                    muon.share_split(p, SplitShare(blocks[sp.ranks], sp.ranks.index(rank), sp.option.ways,
                                                   sp.option.dim))

        def _helper_copies(self) -> set[int]:
            """ids of the main params this rank holds only to help orthogonalize (not the block's first rank)."""
            return {id(p) for _, raw in ours_in(self, Muon) for g in raw.param_groups for p in g["params"]
                    if (s := raw.split_share(p)) is not None and s.index != 0}

        def get_grad_norm(self) -> float:
            helpers = self._helper_copies()
            if not helpers:
                return super().get_grad_norm()
            from megatron.core.optimizer.clip_grads import get_grad_norm_fp32

            skip = {id(p.grad) for sub in megatron_leaves(self) for p in sub.get_parameters()
                    if id(p) in helpers and p.grad is not None}
            grads = [g for sub in megatron_leaves(self) for g in sub.get_main_grads_for_grad_norm()
                     if id(g) not in skip]
            return get_grad_norm_fp32(grads, grad_stats_parallel_group=None)

        def count_zeros(self) -> float:
            helpers = self._helper_copies()
            if not helpers:
                return super().count_zeros()
            from megatron.core.optimizer.clip_grads import count_zeros_fp32

            params = [p for sub in megatron_leaves(self) for p in sub.get_parameters() if id(p) not in helpers]
            return count_zeros_fp32(params, grad_stats_parallel_group=None,
                                    use_decoupled_grad=self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8)

        def sharded_state_dict(self, model_sharded_state_dict: Any, is_loading: bool = False, **kwargs: Any) -> Any:
            out = super().sharded_state_dict(model_sharded_state_dict, is_loading, **kwargs)
            helpers = self._helper_copies()
            if not helpers:
                return out
            from megatron.core.dist_checkpointing.dict_utils import nested_values

            copies = set(helpers) | {id(v) for _, raw in ours_in(self, Muon) for p, st in raw.state.items()
                                     if id(p) in helpers for v in st.values() if hasattr(v, "shape")}
            for sh in nested_values(out):  # the first member's copy is the main replica
                if hasattr(sh, "replica_id") and id(getattr(sh, "data", None)) in copies:
                    rid = sh.replica_id
                    sh.replica_id = 1 if isinstance(rid, int) else (*rid[:2], 1)
            return out

    return NsBalancedLayerWiseOptimizer
