"""The parameterized Bridge perf recipe builder for any system / GPU count.

Bridge's perf presets live with the megatron integration (`nemo_muon.megatron.bridge.perf_presets.BRIDGE_PERF_LAYOUTS`);
this module adds what `_benchmark_common` sets (50 steps, 10 warmup steps, no checkpoints, mock data).
`bridge_perf_recipe()` turns a preset row into a `TrainingRecipe`; the named factories in `kimi_k2.py` /
`qwen3_30b_a3b.py` call it. Torch-free.
"""

from __future__ import annotations

import dataclasses

from nemo_muon.recipes.environment import perf_env

from nemo_muon._validation import check_positive_int
from nemo_muon.config.limits import GPUS_PER_NODE
from nemo_muon.config.optimizer import BaseOptimizerConfig
from nemo_muon.config.recipe import (
    CheckpointConfig,
    DataConfig,
    ParallelismConfig,
    PrecisionConfig,
    SchedulerConfig,
    SystemConfig,
    TrainerConfig,
    TrainingRecipe,
)
from nemo_muon.megatron.bridge.perf_presets import perf_layout
from nemo_muon.models.specs import ModelSpec
from nemo_muon.registry import spec_named

# Bridge `_benchmark_common` / library optimizer helpers (lr 3e-4 -> 3e-5 cosine, clip 1.0)
PREFLIGHT_SYSTEMS: tuple[str, ...] = ("gb300",)
"""Systems whose layer-wise matrix optimizer recipes run `nemo-muon preflight` as the job's first step by default
(``system.preflight``; the issue's choice for the GB300 recipes; ``--no-preflight`` or ``system.preflight=false``
turns it off, ``--preflight`` on for the others)."""
BENCHMARK_STEPS = 50
BENCHMARK_WARMUP_STEPS = 10
BRIDGE_MIN_LR_RATIO = 0.1
BRIDGE_ADAM_EPS: dict[str, float] = {"kimi_k2": 1e-8, "qwen3_30b_a3b": 1e-5}
"""`distributed_fused_adam_with_cosine_annealing`'s adam_eps at the ref each preset comes from: 1e-8 at r0.3.1 (Kimi
K2), 1e-5 at r0.3.0 (Qwen3-30B-A3B); weight decay stays ours (Bridge pins 0.033)."""
BRIDGE_MUON_NS_PRECISION = "bf16"
"""Bridge's `muon_fp32_matmul_prec="medium"` (bf16 matmuls inside NS) for GPU speed."""


def bridge_optimizer(optimizer: str, model: str) -> BaseOptimizerConfig:
    """The optimizer section of a perf recipe: Bridge's settings, with our fixes (momentum 0.95, TP mode
    duplicated, weight decay as set)."""
    spec = spec_named(optimizer)
    # Megatron-Core orthogonalizes the fused gate/up (linear_fc1) as one matrix and has no skip-step for bf16: the
    # megatron backend's mapping refuses split_gate_up=True and nonfinite='skip', so the registry entry's
    # recipe_defaults say so; Bridge's NS precision and Adam eps where the config has those fields.
    values = dict(spec.megatron.recipe_defaults)
    fields = {f.name for f in dataclasses.fields(spec.config_class) if f.init}
    if "ns_precision" in fields:
        values["ns_precision"] = BRIDGE_MUON_NS_PRECISION
    if spec.matrix is None:
        values["eps"] = BRIDGE_ADAM_EPS[model]
    return spec.config_class(**values)


def check_layout(recipe: TrainingRecipe) -> None:
    """Validate the recipe's parallel layout on its world size (the planner's `validate_layout`; raises
    `LayoutError`, a ValueError naming the violated Megatron-Core constraint)."""
    from nemo_muon.accounting.layout import validate_layout

    validate_layout(recipe)


def bridge_perf_recipe(
    name: str,
    model: ModelSpec,
    *,
    optimizer: str = "muon",
    gpu: str = "gb300",
    precision: str = "mxfp8",
    num_gpus: int | None = None,
) -> TrainingRecipe:
    """A megatron-backend benchmark recipe from Bridge's preset for (model, gpu).

    ``num_gpus`` other than the preset's keeps TP/PP/VP/CP/EP and scales the global batch with the GPU count, as
    Bridge's perf launcher does (`gbs_scaling_factor`). The layout is validated.
    """
    row = perf_layout(model.name, gpu)
    gpus = row.num_gpus if num_gpus is None else num_gpus
    check_positive_int("system.num_gpus", gpus)
    per_node = GPUS_PER_NODE[gpu]
    if gpus % per_node:
        raise ValueError(f"system.num_gpus must be a multiple of {per_node} GPUs per {gpu} node; got {gpus}")
    gbs = row.global_batch_size * gpus // row.num_gpus
    recipe = TrainingRecipe(
        name=name,
        model=model,
        optimizer=bridge_optimizer(optimizer, model.name),
        parallelism=ParallelismConfig(tp=row.tp, pp=row.pp, vp=row.vp, cp=row.cp, ep=row.ep, etp=row.etp,
                                      sequence_parallel=row.tp > 1),
        system=SystemConfig(gpu=gpu, num_nodes=gpus // per_node, gpus_per_node=per_node,
                            preflight=gpu in PREFLIGHT_SYSTEMS and spec_named(optimizer).matrix is not None),
        trainer=TrainerConfig(max_steps=BENCHMARK_STEPS, global_batch_size=gbs, micro_batch_size=row.micro_batch_size,
                              seq_length=row.seq_length),
        scheduler=SchedulerConfig(kind="cosine", warmup_steps=BENCHMARK_WARMUP_STEPS, min_lr_ratio=BRIDGE_MIN_LR_RATIO),
        data=DataConfig(kind="mock"),
        precision=PrecisionConfig(kind=precision),
        checkpoint=CheckpointConfig(save_interval=0),
        backend="megatron",
        layerwise=spec_named(optimizer).matrix is not None,
        env=perf_env(gpu, tp=row.tp, cp=row.cp, ep=row.ep, hybrid_ep=row.moe_flex_dispatcher_backend == "hybridep",
                     cudnn_norm=row.cudnn_norm and precision == "mxfp8"),
    )
    check_layout(recipe)
    return recipe
