"""Every GB300 megatron recipe's ConfigContainer carries what Megatron-Bridge's own performance scripts set (read
from `scripts/performance/` at v0.3.1 for Kimi K2 and v0.3.0 for Qwen3-30B-A3B; file:line in the comments), except
the fields listed in `DELIBERATE_DIFFERENCES` (docs/recipes.md), where it holds the "ours" value of the row.

The expectation of a recipe is composed the way the perf scripts compose a run: the model's GB300 workload preset and
kernel settings, the optimizer Bridge applies (`_apply_kimi_k2_optimizer`: the distributed fused Adam or the
distributed Muon helper; Qwen3 ships no Muon run, so its Muon mirrors Kimi K2's), the precision preset of
`utils/precision.py::get_precision_config`, and the MXFP8 workaround for the layer-wise optimizer. SOAP has no Bridge
run at all: its recipes are held to the layout, kernel and precision fields and to Bridge's layer-wise DDP settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
from nemo_muon.recipes import get_recipe, list_recipes

from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.megatron.bridge.container import config_container
from nemo_muon.megatron.bridge_03.library_recipe import DELIBERATE_DIFFERENCES
from tests.megatron_cpu.bridge_validation import target_machine

GB300_RECIPES = sorted(n for n in list_recipes()
                       if get_recipe(n).backend == "megatron" and get_recipe(n).system.gpu == "gb300")
TE_VERSION = "2.12.0"

BRIDGE_PERF_COMMON: dict[str, object] = {
    # utils/overrides.py (_set_common_perf_overrides), perf_plugins.py (manual GC), both models' common configs
    "model.apply_rope_fusion": True, "model.cross_entropy_fusion_impl": "te", "model.moe_router_fusion": True,
    "model.moe_router_force_load_balancing": True, "model.seq_length": 4096,
    "mixed_precision.grad_reduce_in_fp32": False, "ddp.grad_reduce_in_fp32": False, "ddp.check_for_large_grads": False,
    "train.manual_gc": True, "train.manual_gc_interval": 100, "train.train_iters": 50,
    "scheduler.lr_warmup_iters": 10, "scheduler.lr_decay_iters": 50,
    # flex_dispatcher_backend.py apply_flex_dispatcher_backend on a GB300 (also a deliberate-difference row: ours
    # sets them whatever machine builds the config), overrides.py moe_hybridep_num_sms
    "model.moe_token_dispatcher_type": "flex", "model.moe_flex_dispatcher_backend": "hybridep",
    "model.moe_shared_expert_overlap": False, "model.moe_hybridep_num_sms": 32,
}
BRIDGE_PERF_MODEL: dict[str, dict[str, object]] = {
    # Kimi K2, 256 x GB300: configs/kimi/kimi_llm_pretrain.py (set_kimi_k2_common_configs, the GB300 builder),
    # kimi_workload_base_configs.py:27-43 (one preset for BF16, FP8-CS and MXFP8)
    "kimi_k2": {
        "model.tensor_model_parallel_size": 1, "model.pipeline_model_parallel_size": 4,
        "model.virtual_pipeline_model_parallel_size": 4, "model.expert_model_parallel_size": 64,
        "model.recompute_granularity": "selective", "model.recompute_modules": ["mla_up_proj"],
        "model.cuda_graph_impl": "none", "model.cuda_graph_scope": [], "model.qk_clip": False,
        "rng.te_rng_tracker": True, "dist.enable_megatron_core_experimental": True,
        "comm_overlap.overlap_grad_reduce": True, "train.global_batch_size": 4096, "train.micro_batch_size": 2,
    },
    # Qwen3-30B-A3B, 8 x GB300: configs/qwen/qwen3_llm_pretrain.py:30-44 (set_qwen3_common_configs), :205-212
    # (CommOverlapConfig(tp_comm_overlap=True), forced off at TP=1 at runtime), qwen3_workload_base_configs.py:323-333
    "qwen3_30b_a3b": {
        "model.tensor_model_parallel_size": 1, "model.pipeline_model_parallel_size": 1,
        "model.expert_model_parallel_size": 8, "model.bias_activation_fusion": True,
        "model.recompute_granularity": None, "model.recompute_method": None, "model.recompute_num_layers": None,
        "model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_scope": ["moe_router", "moe_preprocess"],
        "model.use_te_rng_tracker": True, "rng.te_rng_tracker": True, "model.qk_clip": False,
        "comm_overlap.tp_comm_overlap": True, "train.global_batch_size": 512, "train.micro_batch_size": 8,
    },
}
BRIDGE_ADAM: dict[str, dict[str, object]] = {
    # recipes/utils/optimizer_utils.py distributed_fused_adam_with_cosine_annealing via _apply_kimi_k2_optimizer
    # (Kimi K2, eps 1e-8 at r0.3.1) and the Qwen3 library recipe (eps 1e-5 at r0.3.0, optimizer_utils.py:85-137)
    "kimi_k2": {"optimizer.adam_eps": 1e-8},
    "qwen3_30b_a3b": {"optimizer.adam_eps": 1e-5},
}
BRIDGE_ADAM_COMMON: dict[str, object] = {
    "optimizer.optimizer": "adam", "optimizer.adam_beta1": 0.9, "optimizer.adam_beta2": 0.95,
    "optimizer.lr": 3e-4, "optimizer.min_lr": 3e-5, "optimizer.weight_decay": 0.1, "optimizer.clip_grad": 1.0,
    "ddp.use_distributed_optimizer": True, "ddp.overlap_param_gather": True,
}
BRIDGE_MUON: dict[str, object] = {
    # optimizer_utils.py distributed_muon_with_cosine_annealing (max_lr 3e-4, min_lr 3e-5) via
    # _apply_kimi_k2_optimizer(cfg, "muon"): layer-wise, so no distributed optimizer and no param-gather overlap
    "optimizer.optimizer": "dist_muon", "optimizer.lr": 3e-4, "optimizer.min_lr": 3e-5,
    "optimizer.muon_momentum": 0.95, "optimizer.muon_use_nesterov": True, "optimizer.muon_scale_mode": "spectral",
    "optimizer.muon_fp32_matmul_prec": "medium", "optimizer.muon_num_ns_steps": 5,
    "optimizer.muon_extra_scale_factor": 1.0, "optimizer.clip_grad": 1.0, "optimizer.weight_decay": 0.1,
}
BRIDGE_LAYER_WISE: dict[str, object] = {"ddp.use_distributed_optimizer": False, "ddp.overlap_param_gather": False}
BRIDGE_PRECISION: dict[str, dict[str, object]] = {
    # utils/precision.py get_precision_config: bf16_mixed / bf16_with_fp8_current_scaling_mixed with
    # first_last_layers_bf16=False / bf16_with_mxfp8_mixed
    "bf16": {"mixed_precision.bf16": True, "mixed_precision.fp8": None, "mixed_precision.fp8_param_gather": False},
    "fp8_cs": {"mixed_precision.bf16": True, "mixed_precision.fp8": "hybrid", "mixed_precision.fp8_recipe": "tensorwise",
               "mixed_precision.first_last_layers_bf16": False, "mixed_precision.fp8_param_gather": True},
    "mxfp8": {"mixed_precision.bf16": True, "mixed_precision.fp8": "e4m3", "mixed_precision.fp8_recipe": "mxfp8"},
}
BRIDGE_MXFP8_PARAM_GATHER: dict[bool, dict[str, object]] = {
    # kimi_llm_pretrain.py set_kimi_k2_common_configs: MXFP8's param all-gather needs the distributed optimizer (WAR:
    # off for the layer-wise one, on for Adam)
    True: {"mixed_precision.fp8_param_gather": True, "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag": True},
    False: {"mixed_precision.fp8_param_gather": False, "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag": False},
}
BRIDGE_RUNTIME: dict[tuple[str, bool], dict[str, object]] = {
    # (model, distributed optimizer) after runtime_config_update: comm_overlap.setup's data-parallel defaults
    # (training/comm_overlap.py:533-546: overlap, 128 MiB buckets) apply with the distributed optimizer only
    ("kimi_k2", True): {"ddp.overlap_grad_reduce": True, "ddp.overlap_param_gather": True,
                        "ddp.bucket_size": 128 * 1024 * 1024, "ddp.align_param_gather": True,
                        "model.overlap_p2p_comm": True, "model.batch_p2p_comm": False},
    ("kimi_k2", False): {"ddp.overlap_grad_reduce": True, "ddp.overlap_param_gather": False, "ddp.bucket_size": None,
                         "model.overlap_p2p_comm": True, "model.batch_p2p_comm": False},
    ("qwen3_30b_a3b", True): {"model.tp_comm_overlap": False, "ddp.overlap_grad_reduce": True,
                              "ddp.overlap_param_gather": True, "ddp.bucket_size": 128 * 1024 * 1024},
    ("qwen3_30b_a3b", False): {"model.tp_comm_overlap": False, "ddp.overlap_grad_reduce": True,
                               "ddp.overlap_param_gather": False, "ddp.bucket_size": None},
}


def bridge_expected(recipe: TrainingRecipe) -> dict[str, object]:
    """What Bridge's perf scripts set for this recipe's (model, optimizer, precision) on GB300."""
    model, opt, precision = recipe.model.name, recipe.optimizer.name, recipe.precision.kind
    out = {**BRIDGE_PERF_COMMON, **BRIDGE_PERF_MODEL[model]}
    if opt == "adamw":
        out.update(BRIDGE_ADAM_COMMON, **BRIDGE_ADAM[model])
    else:
        out.update(BRIDGE_MUON if opt == "muon" else {}, **BRIDGE_LAYER_WISE)
    out.update(BRIDGE_PRECISION[precision])
    if precision == "mxfp8":
        out.update(BRIDGE_MXFP8_PARAM_GATHER[opt == "adamw"])
    return out


def bridge_expected_runtime(recipe: TrainingRecipe) -> dict[str, object]:
    """What Bridge's `runtime_config_update` leaves in the perf config (FP8 param gather copied into DDP)."""
    adam = recipe.optimizer.name == "adamw"
    fp8_gather = bridge_expected(recipe)["mixed_precision.fp8_param_gather"]
    return {**BRIDGE_RUNTIME[(recipe.model.name, adam)], "ddp.fp8_param_gather": fp8_gather}


def _is_muon(recipe: TrainingRecipe) -> bool:
    return recipe.optimizer.name == "muon"


def _always(recipe: TrainingRecipe) -> bool:
    return True


DELIBERATE_OURS: dict[str, tuple[Callable[[TrainingRecipe], bool], Callable[[TrainingRecipe], dict[str, object]]]] = {
    # DeliberateDifference.field -> (which recipes it applies to, the fields' "ours" values)
    "scheduler.start_weight_decay / end_weight_decay": (_always, lambda r: {
        "scheduler.start_weight_decay": r.optimizer.weight_decay, "scheduler.end_weight_decay": r.optimizer.weight_decay,
        "optimizer.weight_decay": r.optimizer.weight_decay}),
    "ddp.check_for_nan_in_grad / rerun_state_machine.check_for_nan_in_loss": (_always, lambda r: {
        "ddp.check_for_nan_in_grad": True, "rerun_state_machine.check_for_nan_in_loss": True}),
    "optimizer.muon_tp_mode": (_is_muon, lambda r: {"optimizer.muon_tp_mode": "duplicated"}),
    "optimizer.adam_beta2 (Adam part of Muon: embeddings, output layer, 1-D params)": (_is_muon, lambda r: {
        "optimizer.adam_beta2": 0.95}),
    "model.moe_token_dispatcher_type / moe_flex_dispatcher_backend / moe_shared_expert_overlap": (_always, lambda r: {
        "model.moe_token_dispatcher_type": "flex", "model.moe_flex_dispatcher_backend": "hybridep",
        "model.moe_shared_expert_overlap": False}),
    "model.qk_clip": (lambda r: r.qk_clip, lambda r: {"model.qk_clip": True}),
    "checkpoint.save / load": (_always, lambda r: {
        "checkpoint.save": r.checkpoint.dir if r.checkpoint.save_interval else None,
        "checkpoint.load": r.checkpoint.dir if r.checkpoint.resume else None}),
    "logger.tensorboard_dir": (_always, lambda r: {
        "logger.tensorboard_dir": f"{r.logging.root}/tensorboard" if r.logging.tensorboard else None}),
}


def _with_checkpoints_and_tensorboard(recipe: TrainingRecipe, root: str) -> TrainingRecipe:
    """The recipe saving every 10 steps into, and resuming from, ``root``/ckpt (not SOAP: the megatron backend
    refuses its checkpoints), with TensorBoard under ``root``."""
    logging = dataclasses.replace(recipe.logging, root=root, tensorboard=True)
    if recipe.optimizer.name == "soap":
        return recipe.replace(logging=logging)
    return recipe.replace(logging=logging, checkpoint=dataclasses.replace(
        recipe.checkpoint, save_interval=10, dir=f"{root}/ckpt", resume=True))


def _equal(ours: object, bridge: object) -> bool:
    if isinstance(bridge, float) and not isinstance(bridge, bool):
        return ours == pytest.approx(bridge, rel=1e-12)
    return ours == bridge and type(ours) is type(bridge) or (isinstance(ours, list) and list(ours) == bridge)


def _get(container, dotted: str):
    section, name = dotted.split(".", 1)
    return getattr(getattr(container, section), name)


def _differ(container, expected: dict[str, object]) -> dict[str, tuple[object, object]]:
    return {f: (want, _get(container, f)) for f, want in expected.items() if not _equal(_get(container, f), want)}


def _deliberate_fields(recipe: TrainingRecipe) -> dict[str, object]:
    """Every field a deliberate-difference row that applies to ``recipe`` covers, with our value."""
    out: dict[str, object] = {}
    for applies, ours in DELIBERATE_OURS.values():
        if applies(recipe):
            out.update(ours(recipe))
    return out


def test_the_comparison_covers_every_gb300_megatron_recipe_and_every_deliberate_difference():
    assert {get_recipe(n).model.name for n in GB300_RECIPES} == set(BRIDGE_PERF_MODEL)
    assert {get_recipe(n).optimizer.name for n in GB300_RECIPES} == {"adamw", "muon", "soap"}
    assert {get_recipe(n).precision.kind for n in GB300_RECIPES} == set(BRIDGE_PRECISION)
    assert list(DELIBERATE_OURS) == [d.field for d in DELIBERATE_DIFFERENCES]
    assert any(get_recipe(n).qk_clip for n in GB300_RECIPES)  # the qk_clip row applies somewhere


@pytest.mark.parametrize("name", GB300_RECIPES)
def test_gb300_recipe_equals_bridges_perf_config(name, bridge):
    recipe = get_recipe(name)
    with target_machine(recipe.system.gpu, TE_VERSION):
        container = config_container(recipe)
    deliberate = _deliberate_fields(recipe)
    expected = {f: v for f, v in bridge_expected(recipe).items() if f not in deliberate or v == deliberate[f]}
    differ = _differ(container, expected)
    assert not differ, f"(Bridge, ours) where undocumented: {differ}"


@pytest.mark.parametrize("name", GB300_RECIPES)
def test_gb300_recipe_equals_bridges_perf_config_after_runtime_setup(name, bridge, monkeypatch):
    from megatron.bridge.training.config import runtime_config_update

    recipe = get_recipe(name)
    monkeypatch.setenv("WORLD_SIZE", str(recipe.system.world_size))
    with target_machine(recipe.system.gpu, TE_VERSION):
        container = config_container(recipe)
        runtime_config_update(container)
    differ = _differ(container, bridge_expected_runtime(recipe))
    assert not differ, f"(Bridge, ours) after runtime_config_update: {differ}"


@pytest.mark.parametrize("name", GB300_RECIPES)
def test_gb300_container_holds_ours_for_each_deliberate_difference(name, bridge, tmp_path):
    """As registered, and with checkpoints and TensorBoard on (the rows whose value follows the recipe)."""
    for recipe in (get_recipe(name), _with_checkpoints_and_tensorboard(get_recipe(name), str(tmp_path))):
        with target_machine(recipe.system.gpu, TE_VERSION):
            container = config_container(recipe)
        differ = _differ(container, _deliberate_fields(recipe))
        assert not differ, f"(ours as documented, container) for {recipe.name}: {differ}"
