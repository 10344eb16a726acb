"""What one preflight runs: a recipe (with its overrides), the allocation's ranks, the steps and the tolerances.

`PreflightRequest` is validated at construction: an unknown recipe, a recipe whose backend is not megatron, an
optimizer that is not a layer-wise matrix optimizer, a pipeline or expert-parallel size the allocation cannot host,
or steps too few to save and resume are refused in one line naming the field, the value and what is allowed, before
anything starts. `preflight_plan` says which optimizer paths the two runs take on the installed Megatron-Core.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from nemo_muon._validation import check_choice, check_positive_int, check_range

DEFAULT_STEPS = 10
"""Optimizer steps of each run (the issue's default; chosen, not tuned)."""
MAX_STEPS = 200
DEFAULT_TIME_LIMIT_S = 900.0
"""Wall-clock bound of the whole preflight on every rank (chosen: well inside an allocation's first quarter hour)."""
LOSS_RTOL = 1e-2
"""Losses, ours against the reference path: |ours - reference| / |reference| per step (chosen: the two paths reduce
bf16 gradients in different orders; at most 2.7e-04 over 10 steps in the CPU runs of bench/preflight_cpu.py and tests/megatron_cpu/test_preflight.py)."""
MASTER_RTOL = 0.5
"""Masters after the first step, ours against the reference path: max |ours - reference| / max |reference - initial|
per parameter, i.e. relative to how far the step moved it (chosen: on CPU at 2 ranks the two paths are bit for bit;
at 4 ranks, bf16 gradients summed in another order, Newton-Schulz amplifies the rounding to 0.25-0.30 of the update;
a gradient that reached the wrong rank, or an update not applied, moves a matrix by a whole update: 1 or more)."""
STEP_TIME_RATIO = 3.0
"""Largest accepted median optimizer-step time, ours over the reference path's (chosen: a bound that flags a path
several times slower, not a performance target)."""
DEVICES: tuple[str, ...] = ("cuda", "cpu")
"""``device``: NCCL on GPUs (the preflight), or gloo on CPU ranks where Megatron's CUDA calls are answered (tests)."""
WARMUP_STEPS = 2
"""Steps left out of the step-time medians (first-call allocation, kernel compilation)."""


@dataclasses.dataclass(frozen=True)
class ParallelLayout:
    """Where the tiny model's parameters live on ``ranks`` ranks: ``pp`` pipeline stages, each of ``ranks / pp``
    data-parallel ranks (TP = CP = 1), its experts over ``ep`` of them."""

    ranks: int
    pp: int = 1
    ep: int = 1

    @property
    def dp(self) -> int:
        """The dense parameters' data-parallel size."""
        return self.ranks // self.pp

    @property
    def expert_dp(self) -> int:
        """The experts' data-parallel size."""
        return self.ranks // (self.pp * self.ep)

    def describe(self) -> str:
        """``PP=2 EP=2 (DP 2, expert DP 1)``."""
        return f"PP={self.pp} EP={self.ep} (DP {self.dp}, expert DP {self.expert_dp})"

    def topology(self) -> dict[str, int]:
        """The sizes, as the report's JSON names them."""
        return {"world_size": self.ranks, "pipeline_parallel": self.pp, "expert_parallel": self.ep,
                "data_parallel": self.dp, "expert_data_parallel": self.expert_dp}


@dataclasses.dataclass(frozen=True)
class PreflightRequest:
    """One preflight: ``recipe`` with ``overrides`` (``a.b=value``), on ``world_size`` ranks, ``steps`` steps of
    the tiny model of the recipe's family, saved after ``save_at`` steps (None: half of ``steps``) and resumed;
    pipeline parallelism ``pp`` (must divide ``world_size`` and the tiny model's layers), expert parallelism ``ep``
    (must divide ``world_size / pp`` and the tiny model's experts), each None for the recipe's scaled to the ranks
    (`allocation_pp`, `allocation_ep`: what ``launch --preflight`` runs); reports under ``out_dir``."""

    recipe: str
    world_size: int
    overrides: tuple[str, ...] = ()
    steps: int = DEFAULT_STEPS
    save_at: int | None = None
    ep: int | None = 1
    pp: int | None = 1
    out_dir: str = "preflight"
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    resolved: Any = None
    """The recipe already resolved (a job's ``--recipe-file``: `nemo_muon.recipes.resolved`); then ``overrides``
    are the ones it was resolved with, recorded, not applied again."""
    device: str = "cuda"
    """One of `DEVICES`."""
    loss_rtol: float = LOSS_RTOL
    master_rtol: float = MASTER_RTOL
    step_time_ratio: float = STEP_TIME_RATIO

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", tuple(self.overrides))
        check_positive_int("preflight.world_size", self.world_size)
        check_positive_int("preflight.steps", self.steps, minimum=WARMUP_STEPS + 2, maximum=MAX_STEPS)
        if self.save_at is not None:
            check_positive_int("preflight.save_at", self.save_at, maximum=self.steps - 1)
        check_choice("preflight.device", self.device, DEVICES)
        check_range("preflight.time_limit_s", self.time_limit_s, low=0.0, low_inclusive=False)
        check_range("preflight.loss_rtol", self.loss_rtol, low=0.0)
        check_range("preflight.master_rtol", self.master_rtol, low=0.0)
        check_range("preflight.step_time_ratio", self.step_time_ratio, low=0.0, low_inclusive=False)
        recipe = self._build_recipe()
        object.__setattr__(self, "_recipe", recipe)  # built once: the ranks and the job reuse it
        check_preflight_recipe(recipe, self.recipe)
        if self.pp is None:
            object.__setattr__(self, "pp", allocation_pp(recipe, self.world_size, self.ep))
        if self.ep is None:
            object.__setattr__(self, "ep", allocation_ep(recipe, self.world_size, self.pp))
        layers = tiny_layers(recipe)
        stages = hostable_sizes(self.world_size, layers)
        if self.pp not in stages:
            raise ValueError(f"preflight.pp must be one of {stages} (divides world_size={self.world_size} and the "
                             f"tiny model's {layers} layers); got {self.pp!r}")
        experts = tiny_experts(recipe)
        hostable = hostable_sizes(self.world_size // self.pp, experts)
        if self.ep not in hostable:
            raise ValueError(f"preflight.ep must be one of {hostable} (divides world_size / pp = "
                             f"{self.world_size // self.pp} and the tiny model's {experts} experts); got {self.ep!r}")

    @property
    def layout(self) -> ParallelLayout:
        """The request's parallel layout on its ranks."""
        return ParallelLayout(self.world_size, self.pp, self.ep)

    @property
    def checkpoint_step(self) -> int:
        """Steps before the save the resume check continues from."""
        return self.save_at if self.save_at is not None else self.steps // 2

    def training_recipe(self) -> Any:
        """The recipe with the overrides applied and checked (`nemo_muon.recipes.execute.build_recipe`), or the
        one ``resolved``; built once, at construction."""
        return self._recipe  # type: ignore[attr-defined]

    def _build_recipe(self) -> Any:
        from nemo_muon.recipes import list_recipes
        from nemo_muon.recipes.execute import build_recipe

        if self.resolved is not None:
            return self.resolved
        names = list_recipes()
        if self.recipe not in names:
            raise ValueError(f"preflight.recipe must be one of {tuple(n for n in names if _is_megatron(n))}; "
                             f"got {self.recipe!r}")
        return build_recipe(self.recipe, self.overrides)


def _is_megatron(name: str) -> bool:
    from nemo_muon.recipes import get_recipe

    recipe = get_recipe(name)
    return recipe.backend == "megatron" and _is_matrix(recipe.optimizer)


def _is_matrix(opt: Any) -> bool:
    from nemo_muon.registry import spec_for

    return spec_for(opt).matrix is not None


def check_preflight_recipe(recipe: Any, name: str) -> None:
    """Refuse a recipe preflight cannot prove: not on the megatron backend, or whose optimizer is not a layer-wise
    matrix optimizer (AdamW runs Megatron's own distributed optimizer, which preflight does not test)."""
    from nemo_muon.registry import spec_for

    if recipe.backend != "megatron":
        raise ValueError(f"backend must be 'megatron' for preflight (it proves the megatron optimizer path); recipe "
                         f"{name!r} has backend={recipe.backend!r}")
    if spec_for(recipe.optimizer).matrix is None:
        raise ValueError(f"optimizer.kind must be a layer-wise matrix optimizer for preflight (muon, soap, normuon, "
                         f"...); recipe {name!r} has optimizer.kind={recipe.optimizer.name!r}")


def hostable_sizes(ranks: int, parts: int) -> tuple[int, ...]:
    """The parallel sizes ``ranks`` ranks host over ``parts`` equal parts: the common divisors (pipeline sizes over
    the tiny model's layers on the world, expert-parallel sizes over its experts on a stage's ranks)."""
    return tuple(d for d in range(1, ranks + 1) if ranks % d == 0 and parts % d == 0)


def allocation_pp(recipe: Any, world_size: int, ep: int | None = None) -> int:
    """The pipeline-parallel size a job's preflight runs on ``world_size`` ranks: the largest that the ranks and the
    tiny model's layers host, is at most the recipe's ``parallelism.pp``, leaves a stage's ranks divisible by ``ep``
    (when given) and every stage 2 data-parallel ranks where the ranks allow it (the layer-wise optimizer's
    ownership is what preflight proves; a chosen rule). An ``ep`` no stage hosts: 1, whose stage hosts the most
    sizes (the request's refusal names them)."""
    stages = [d for d in hostable_sizes(world_size, tiny_layers(recipe)) if d <= recipe.parallelism.pp]
    fits = [d for d in stages if ep is None or (world_size // d) % ep == 0]
    if not fits:
        return 1
    with_replicas = [d for d in fits if world_size // d >= 2]
    return max(with_replicas or fits)


def allocation_ep(recipe: Any, world_size: int, pp: int = 1) -> int:
    """The expert-parallel size a job's preflight runs on ``world_size`` ranks at pipeline size ``pp``: the largest
    that divides a stage's ranks and the tiny model's experts and is at most the recipe's ``parallelism.ep`` (the
    recipe's layout, scaled down)."""
    return max(d for d in hostable_sizes(world_size // pp, tiny_experts(recipe)) if d <= recipe.parallelism.ep)


def _tiny_spec(recipe: Any) -> Any:
    from nemo_muon.models.specs import get_model_spec
    from nemo_muon.preflight.tiny_model import tiny_spec_of_family

    return get_model_spec(tiny_spec_of_family(recipe.model.family))


def tiny_experts(recipe: Any) -> int:
    """Routed experts of the tiny model of the recipe's family."""
    return _tiny_spec(recipe).num_experts


def tiny_layers(recipe: Any) -> int:
    """Decoder layers of the tiny model of the recipe's family."""
    return _tiny_spec(recipe).num_layers


@dataclasses.dataclass(frozen=True)
class PreflightPath:
    """One of the two runs: its optimizer config, on Megatron-Core >= 0.18 DDP's layout
    (`nemo_muon.preflight.wiring.LAYOUTS`), and who builds the model's DDP wrap and the optimizer
    (`nemo_muon.preflight.bridge_setup.SETUPS`)."""

    role: str
    opt: Any
    layout: str
    setup: str = "megatron-core"

    def __post_init__(self) -> None:
        from nemo_muon.preflight.bridge_setup import SETUPS

        check_choice("preflight path setup", self.setup, SETUPS)

    def describe(self) -> str:
        """One line: engine, collectives, ownership, setup, layout."""
        split = getattr(self.opt, "ns_split_target", None)
        return (f"engine={getattr(self.opt, 'engine', None)} collectives={getattr(self.opt, 'collectives', None)} "
                f"ownership={'whole-tensor' if split is None else f'split to max/mean {split}'} "
                f"setup={self.setup} layout={self.layout}")


def preflight_plan(recipe: Any, parameter_layout: bool,
                   bridge_setup: bool = False) -> tuple[PreflightPath, PreflightPath]:
    """(ours, reference): ours is the recipe's optimizer as the real job builds it (``collectives``,
    ``ns_split_target``; on >= 0.18 ``reduce_scatter`` is DDP's cost layout; ``bridge_setup``: through
    Megatron-Bridge's own model and optimizer setup, `nemo_muon.preflight.bridge_setup`), the reference the same
    optimizer on the least-patched path of the stack (``collectives='all_reduce'``, whole-tensor ownership; on >= 0.18
    the legacy layout: Megatron's DDP and layer-wise all-gather, nothing of ours in between; built on Megatron-Core
    directly)."""
    opt = recipe.optimizer
    reduce_scatter = getattr(opt, "collectives", "all_reduce") == "reduce_scatter"
    ours_layout = "cost" if parameter_layout and reduce_scatter else "legacy"
    reference_opt = dataclasses.replace(opt, collectives="all_reduce")
    if hasattr(opt, "ns_split_target"):
        reference_opt = dataclasses.replace(reference_opt, ns_split_target=None)
    ours_setup = "bridge" if bridge_setup else "megatron-core"
    return (PreflightPath("ours", opt, ours_layout, ours_setup),
            PreflightPath("reference", reference_opt, "legacy"))
