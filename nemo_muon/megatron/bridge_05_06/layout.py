"""The reduce-scatter layout owned by update cost inside Megatron-Bridge 0.5 / 0.6's own model setup.

Bridge builds DDP itself: its model provider runs the pre-wrap hooks (public ``register_pre_wrap_hook``), applies
Float16Module, then calls Megatron-Core's ``megatron.training.models.dist_utils._ddp_wrap``, which, with
``ddp.use_distributed_optimizer``, computes every chunk's parameter layout through the module name
``DistributedOptimizer`` (``DistributedOptimizer.compute_full_param_layout``) and tags nothing. Bridge has no public
hook for that layout. `install` therefore does two things, both pinned:

1. a pre-wrap hook on the model config tags the parameters (layer-wise matrix or not) and each matrix with its update
   cost (`nemo_muon.megatron.core_018_plus.cost_layout.tag_with_costs`);
2. the name ``DistributedOptimizer`` in ``dist_utils`` (that module only) becomes a `CostLayoutPlanner`, whose
   ``compute_full_param_layout`` returns `cost_layout.plan_cost_layout(...).layout` over Megatron's initialized
   process groups (checked against the sizes ``_ddp_wrap`` passes) for a tagged model, and Megatron's own layout for
   an untagged one; any other attribute is Megatron's class.

`check_hook_point` refuses another Bridge minor, a Megatron-Core without the layout API, and a ``dist_utils`` whose
source uses that name other than in the one call, so an upgrade fails loudly instead of silently running Megatron's
numel layout under our optimizer.
"""

from __future__ import annotations

import importlib.metadata
import inspect
from collections.abc import Sequence
from typing import Any

from nemo_muon.megatron.generations import BRIDGE_GENERATIONS

SUPPORTED_BRIDGE: tuple[tuple[int, int], ...] = tuple(g.minor for g in BRIDGE_GENERATIONS
                                                     if g.cost_layout == f"{__name__}:install")
"""The Bridge minors whose row (`nemo_muon.megatron.generations`) builds DDP on the cost layout through here."""
HOOKED_NAME = "DistributedOptimizer"
HOOKED_CALL = f"{HOOKED_NAME}.compute_full_param_layout("


class CostLayoutPlanner:
    """Stands in for Megatron's `DistributedOptimizer` in ``dist_utils``: the cost layout for a tagged model."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.plans: list[Any] = []
        """The `CostLayout` of each chunk planned in this process, in order (for tests and logs)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)

    def compute_full_param_layout(self, params: Sequence[Any], bucket_size: int | None,
                                  data_parallel_world_size: int, ddp_config: Any,
                                  expert_data_parallel_world_size: int = 1) -> Any:
        from nemo_muon.megatron.core_018_plus.cost_layout import COST_ATTRIBUTE, plan_cost_layout
        from nemo_muon.megatron.shared.build import mpu_process_groups

        params = list(params)
        if not any(hasattr(p, COST_ATTRIBUTE) for p in params):  # not ours (AdamW, or no layer-wise matrix)
            return self.original.compute_full_param_layout(params, bucket_size, data_parallel_world_size, ddp_config,
                                                           expert_data_parallel_world_size=expert_data_parallel_world_size)
        pgs = mpu_process_groups()
        sizes = (pgs.dp_cp.size(), pgs.expt_dp.size())
        if sizes != (data_parallel_world_size, expert_data_parallel_world_size):
            raise RuntimeError(f"Bridge's DDP wrap shards over (dp_cp, expt_dp) = "
                               f"{(data_parallel_world_size, expert_data_parallel_world_size)} but Megatron's "
                               f"initialized groups are {sizes} (several optimizer instances?); the cost layout "
                               "plans over Megatron's groups")
        plan = plan_cost_layout(params, bucket_size, ddp_config, pgs)
        self.plans.append(plan)
        return plan.layout


def check_hook_point(dist_utils: Any, bridge_version: str) -> None:
    """Raise unless Bridge is 0.5.x / 0.6.x, Megatron-Core has the layer-wise layout API, and ``dist_utils`` uses
    `HOOKED_NAME` only in ``_ddp_wrap``'s one layout call."""
    from nemo_muon.megatron.core_018_plus.cost_layout import check_layout_api
    from nemo_muon.versions import release_numbers

    if release_numbers(bridge_version)[:2] not in SUPPORTED_BRIDGE:
        raise RuntimeError(f"the cost layout is wired into Megatron-Bridge "
                           f"{' / '.join('.'.join(map(str, v)) + '.x' for v in SUPPORTED_BRIDGE)}; installed "
                           f"megatron-bridge {bridge_version}")
    check_layout_api()
    source = inspect.getsource(dist_utils)
    current = getattr(dist_utils, HOOKED_NAME, None)
    if (current is None or source.count(HOOKED_NAME) != 2 or source.count(HOOKED_CALL) != 1
            or HOOKED_CALL not in inspect.getsource(dist_utils._ddp_wrap)):
        raise RuntimeError(f"megatron.training.models.dist_utils no longer uses {HOOKED_NAME} only in _ddp_wrap's "
                           f"{HOOKED_CALL}...) (Bridge {bridge_version}): the cost-layout hook point moved")


def _planner(dist_utils: Any) -> CostLayoutPlanner | None:
    current = getattr(dist_utils, HOOKED_NAME, None)
    return current if isinstance(current, CostLayoutPlanner) else None


def install(model_config: Any, ours: Any) -> CostLayoutPlanner:
    """Register the tagging pre-wrap hook on Bridge's ``model_config`` (a model provider, or a ``ModelConfig`` with
    ``pre_wrap_hooks``) and route ``dist_utils``'s layout call to a `CostLayoutPlanner` (once per process)."""
    from megatron.training.models import dist_utils

    from nemo_muon.megatron.core_018_plus.cost_layout import tag_with_costs
    from nemo_muon.megatron.shared.build import mpu_process_groups

    planner = _planner(dist_utils)
    if planner is None:
        check_hook_point(dist_utils, importlib.metadata.version("megatron-bridge"))
        planner = CostLayoutPlanner(getattr(dist_utils, HOOKED_NAME))

    def tag_for_cost_layout(model: list[Any]) -> list[Any]:
        tag_with_costs(model, ours, mpu_process_groups())
        return model

    if hasattr(model_config, "register_pre_wrap_hook"):
        model_config.register_pre_wrap_hook(tag_for_cost_layout)
    elif isinstance(getattr(model_config, "pre_wrap_hooks", None), list):
        model_config.pre_wrap_hooks.append(tag_for_cost_layout)
    else:
        raise TypeError(f"{type(model_config).__name__} takes no pre-wrap hook (register_pre_wrap_hook / "
                        "pre_wrap_hooks)")
    setattr(dist_utils, HOOKED_NAME, planner)
    return planner


def installed() -> bool:
    """Whether Bridge's DDP wrap currently plans the cost layout."""
    from megatron.training.models import dist_utils

    return _planner(dist_utils) is not None
