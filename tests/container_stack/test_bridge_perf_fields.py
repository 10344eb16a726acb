"""The GB300 recipes' ConfigContainers carry what Megatron-Bridge's own performance scripts set (read from
`scripts/performance/` at v0.3.1 for Kimi K2 and v0.3.0 for Qwen3-30B-A3B; file:line in the comments), except the
fields listed in `DELIBERATE_DIFFERENCES` (docs/recipes.md)."""

from __future__ import annotations

import pytest
from nemo_muon.recipes import get_recipe

from nemo_muon.megatron.bridge import config_container
from tests.megatron_cpu.bridge_validation import target_machine

BRIDGE_PERF_GB300: dict[str, dict[str, object]] = {
    # Kimi K2, 256 x GB300, MXFP8: configs/kimi/kimi_llm_pretrain.py, kimi_workload_base_configs.py:27-43,
    # utils/overrides.py (_set_common_perf_overrides, set_workload_base_configs), perf_plugins.py (manual GC)
    "kimi_k2_muon": {
        "model.tensor_model_parallel_size": 1, "model.pipeline_model_parallel_size": 4,
        "model.virtual_pipeline_model_parallel_size": 4, "model.expert_model_parallel_size": 64,
        "model.moe_token_dispatcher_type": "flex", "model.moe_flex_dispatcher_backend": "hybridep",
        "model.moe_shared_expert_overlap": False, "model.moe_hybridep_num_sms": 32,
        "model.moe_router_fusion": True, "model.apply_rope_fusion": True, "model.cross_entropy_fusion_impl": "te",
        "model.recompute_granularity": "selective", "model.recompute_modules": ["mla_up_proj"],
        "model.cuda_graph_impl": "none", "model.cuda_graph_scope": [], "model.moe_router_force_load_balancing": True,
        "model.qk_clip": False, "rng.te_rng_tracker": True, "dist.enable_megatron_core_experimental": True,
        "mixed_precision.grad_reduce_in_fp32": False, "ddp.grad_reduce_in_fp32": False,
        "mixed_precision.fp8_param_gather": False, "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag": False,
        "ddp.use_distributed_optimizer": False, "ddp.overlap_param_gather": False,
        "ddp.check_for_large_grads": False, "comm_overlap.overlap_grad_reduce": True,
        "train.global_batch_size": 4096, "train.micro_batch_size": 2, "train.train_iters": 50,
        "train.manual_gc": True, "train.manual_gc_interval": 100, "scheduler.lr_warmup_iters": 10,
        "scheduler.lr_decay_iters": 50, "model.seq_length": 4096,
        "optimizer.optimizer": "dist_muon", "optimizer.lr": 3e-4, "optimizer.min_lr": 3e-5,
        "optimizer.muon_momentum": 0.95, "optimizer.muon_use_nesterov": True, "optimizer.muon_scale_mode": "spectral",
        "optimizer.muon_fp32_matmul_prec": "medium", "optimizer.muon_num_ns_steps": 5, "optimizer.clip_grad": 1.0,
        "optimizer.weight_decay": 0.1,
    },
    "kimi_k2_adamw": {
        "optimizer.optimizer": "adam", "optimizer.adam_beta1": 0.9, "optimizer.adam_beta2": 0.95,
        "optimizer.adam_eps": 1e-8, "ddp.use_distributed_optimizer": True, "ddp.overlap_param_gather": True,
        "mixed_precision.fp8_param_gather": True, "mixed_precision.reuse_grad_buf_for_mxfp8_param_ag": True,
    },
    # Qwen3-30B-A3B, 8 x GB300, MXFP8 (v0.3.0): configs/qwen/qwen3_llm_pretrain.py:30-44 (set_qwen3_common_configs),
    # qwen3_workload_base_configs.py:323-333, recipes/utils/optimizer_utils.py:85-137
    "qwen3_30b_a3b_adamw": {
        "model.tensor_model_parallel_size": 1, "model.pipeline_model_parallel_size": 1,
        "model.expert_model_parallel_size": 8, "model.moe_token_dispatcher_type": "flex",
        "model.moe_flex_dispatcher_backend": "hybridep", "model.moe_shared_expert_overlap": False,
        "model.moe_hybridep_num_sms": 32, "model.bias_activation_fusion": True, "model.moe_router_fusion": True,
        "model.recompute_granularity": None, "model.recompute_method": None, "model.recompute_num_layers": None,
        "model.cuda_graph_impl": "transformer_engine", "model.cuda_graph_scope": ["moe_router", "moe_preprocess"],
        "model.use_te_rng_tracker": True, "rng.te_rng_tracker": True, "model.apply_rope_fusion": True,
        "model.moe_router_force_load_balancing": True, "mixed_precision.grad_reduce_in_fp32": False,
        "ddp.grad_reduce_in_fp32": False, "train.global_batch_size": 512, "train.micro_batch_size": 8,
        "train.manual_gc_interval": 100, "optimizer.optimizer": "adam", "optimizer.adam_beta1": 0.9,
        "optimizer.adam_beta2": 0.95, "optimizer.adam_eps": 1e-5, "optimizer.lr": 3e-4, "optimizer.min_lr": 3e-5,
        "ddp.use_distributed_optimizer": True, "mixed_precision.fp8_param_gather": True,
        "comm_overlap.tp_comm_overlap": True,  # qwen3_llm_pretrain.py:205-212 (forced off at TP=1 at runtime)
    },
}


def _equal(ours: object, bridge: object) -> bool:
    if isinstance(bridge, float) and not isinstance(bridge, bool):
        return ours == pytest.approx(bridge, rel=1e-12)
    return ours == bridge and type(ours) is type(bridge) or (isinstance(ours, list) and list(ours) == bridge)


def _get(container, dotted: str):
    section, name = dotted.split(".", 1)
    return getattr(getattr(container, section), name)


BRIDGE_PERF_GB300_RUNTIME: dict[str, dict[str, object]] = {
    # after runtime_config_update: comm_overlap.setup's data-parallel defaults (training/comm_overlap.py:533-546) apply
    # with the distributed optimizer only; MXFP8 param gather stays on for AdamW
    "qwen3_30b_a3b_adamw": {"model.tp_comm_overlap": False, "ddp.overlap_grad_reduce": True,
                            "ddp.overlap_param_gather": True, "ddp.bucket_size": 128 * 1024 * 1024,
                            "ddp.fp8_param_gather": True},
    "kimi_k2_adamw": {"ddp.overlap_grad_reduce": True, "ddp.overlap_param_gather": True,
                      "ddp.bucket_size": 128 * 1024 * 1024, "ddp.align_param_gather": True},
    "kimi_k2_muon": {"ddp.overlap_grad_reduce": True, "ddp.overlap_param_gather": False,
                     "model.overlap_p2p_comm": True, "model.batch_p2p_comm": False},
}


@pytest.mark.parametrize("name", sorted(BRIDGE_PERF_GB300_RUNTIME))
def test_gb300_recipe_equals_bridges_perf_config_after_runtime_setup(name, bridge, monkeypatch):
    from megatron.bridge.training.config import runtime_config_update

    recipe = get_recipe(name)
    monkeypatch.setenv("WORLD_SIZE", str(recipe.system.world_size))
    with target_machine(recipe.system.gpu, "2.12.0"):
        container = config_container(recipe)
        runtime_config_update(container)
    differ = {f: (want, _get(container, f)) for f, want in BRIDGE_PERF_GB300_RUNTIME[name].items()
              if not _equal(_get(container, f), want)}
    assert not differ, f"(Bridge, ours) after runtime_config_update: {differ}"


@pytest.mark.parametrize("name", sorted(BRIDGE_PERF_GB300))
def test_gb300_recipe_equals_bridges_perf_config(name, bridge):
    recipe = get_recipe(name)
    with target_machine(recipe.system.gpu, "2.12.0"):
        container = config_container(recipe)
    differ = {f: (want, _get(container, f)) for f, want in BRIDGE_PERF_GB300[name].items()
              if not _equal(_get(container, f), want)}
    assert not differ, f"(Bridge, ours) where undocumented: {differ}"
