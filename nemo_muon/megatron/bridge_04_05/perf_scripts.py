"""What Megatron-Bridge 0.4's and 0.5's performance runs set on top of the library recipe, as data (torch-free).

Bridge 0.4.2 (NGC 26.04) and 0.5.1 (NGC 26.06) keep their performance configs outside the wheel, in
``scripts/performance/`` of the repository at the release tag: a builder per model and GPU
(``configs/kimi/kimi_llm_pretrain.py``, ``configs/qwen/qwen3_llm_pretrain.py``) takes the library recipe, sets its
model's perf fields and a workload preset (``configs/*/*_workload_base_configs.py``, applied by
``utils/overrides.py`` ``set_workload_base_configs``); ``run_script.py`` then applies ``set_user_overrides`` (mock data,
nothing else without command-line options), ``perf_plugins.py`` ``PerfEnvPlugin`` (manual GC) and
``set_post_overrides``. Read at those tags and written here as data (no code of theirs): `WORKLOADS` per (release,
model, GPU, precision), `COMMON_FIELDS`, `MODEL_FIELDS`; `perf_script_fields` composes them in the scripts' order, with
the dispatcher fields Bridge's GPU check gives on the recipe's target GPU (`FLEX_BACKENDS`), whatever machine builds
the config. What ours set differently is in that release's deliberate differences
(`nemo_muon.megatron.bridge_04_05.library_recipe`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nemo_muon._validation import fail

Minor = tuple[int, int]
BRIDGE_04: Minor = (0, 4)
BRIDGE_05: Minor = (0, 5)
TAGS: dict[Minor, str] = {BRIDGE_04: "v0.4.2", BRIDGE_05: "v0.5.1"}
"""The Bridge tag whose ``scripts/performance/`` each release's data was read from."""
PERF_RUN_STEPS = 50
"""``train_iters`` of every perf run (``_set_common_perf_overrides``); the schedule decays over them."""


@dataclass(frozen=True, kw_only=True)
class Workload:
    """One ``WorkloadBaseConfig`` of a release (the fields our models' presets set). ``None``: the preset leaves the
    field to the library recipe (``cuda_graph_impl``, ``cuda_graph_scope``, ``recompute_modules``)."""

    num_gpus: int
    tp: int = 1
    pp: int = 1
    vp: int | None = None
    ep: int = 1
    etp: int | None = 1
    global_batch_size: int
    micro_batch_size: int = 1
    moe_flex_dispatcher_backend: str | None = None
    moe_a2a_overlap: bool = False
    cuda_graph_impl: str | None = None
    cuda_graph_scope: tuple[str, ...] | None = None
    recompute_modules: tuple[str, ...] | None = None
    cutedsl_fused_grouped_mlp: bool = False
    """Bridge 0.5: TE's fused grouped MLP (``use_transformer_engine_op_fuser`` and its interleave)."""
    fp8_dot_product_attention: bool | None = None
    """Bridge 0.5: ``mixed_precision.fp8_dot_product_attention`` when not None."""


_ROUTER_GRAPHS = ("moe_router", "moe_preprocess")
_ATTN_ROUTER_GRAPHS = ("attn", *_ROUTER_GRAPHS)
# configs/kimi/kimi_workload_base_configs.py (v0.4.2 = v0.5.1 for these GPUs; one preset for every precision)
_KIMI_GB300 = Workload(num_gpus=256, pp=4, vp=4, ep=64, global_batch_size=4096, micro_batch_size=2,
                       moe_flex_dispatcher_backend="hybridep", cuda_graph_scope=(), recompute_modules=("mla_up_proj",))
_KIMI_GB200 = Workload(num_gpus=256, pp=4, vp=4, ep=64, global_batch_size=2048, moe_flex_dispatcher_backend="hybridep",
                       recompute_modules=("mla_up_proj",), cuda_graph_impl="transformer_engine",
                       cuda_graph_scope=_ROUTER_GRAPHS)
_KIMI_B200 = Workload(num_gpus=256, pp=16, ep=16, global_batch_size=2048, recompute_modules=("mla_up_proj",))
# configs/qwen/qwen3_workload_base_configs.py (the *_V1 presets; BASE_QWEN3_30B_A3B_CONFIG: EP8, GBS 512)
_QWEN = Workload(num_gpus=8, ep=8, global_batch_size=512, moe_flex_dispatcher_backend="hybridep",
                 cuda_graph_impl="transformer_engine", cuda_graph_scope=_ROUTER_GRAPHS)
_QWEN_GB300 = dataclasses.replace(_QWEN, micro_batch_size=8)
_QWEN_GB200 = dataclasses.replace(_QWEN, micro_batch_size=4, cuda_graph_scope=_ATTN_ROUTER_GRAPHS)
_QWEN_B200 = _QWEN_GB200
_QWEN_H100_FP8_CS = dataclasses.replace(_QWEN, num_gpus=16, ep=16, global_batch_size=1024, cuda_graph_impl=None,
                                        cuda_graph_scope=None)
# v0.5.1: the MXFP8 presets of GB300 / GB200 / B200 capture the full iteration, overlap the EP all-to-all and fuse
# the grouped MLP in TE
_FULL_ITERATION = dict(moe_a2a_overlap=True, cuda_graph_impl="full_iteration", cuda_graph_scope=(),
                       cutedsl_fused_grouped_mlp=True, fp8_dot_product_attention=True)

_KIMI = {"gb300": _KIMI_GB300, "gb200": _KIMI_GB200, "b200": _KIMI_B200}
_PRECISIONS = ("bf16", "fp8_cs", "mxfp8")
_WORKLOADS_04: dict[tuple[str, str, str], Workload] = {
    **{("kimi_k2", gpu, p): w for gpu, w in _KIMI.items() for p in _PRECISIONS},
    **{("qwen3_30b_a3b", "gb300", p): _QWEN_GB300 for p in _PRECISIONS},
    ("qwen3_30b_a3b", "gb200", "bf16"): _QWEN_GB200,
    ("qwen3_30b_a3b", "gb200", "fp8_cs"): _QWEN_GB200,
    ("qwen3_30b_a3b", "gb200", "mxfp8"): dataclasses.replace(_QWEN_GB200, cuda_graph_scope=_ROUTER_GRAPHS),
    **{("qwen3_30b_a3b", "b200", p): _QWEN_B200 for p in _PRECISIONS},
    ("qwen3_30b_a3b", "h100", "bf16"): dataclasses.replace(_QWEN, num_gpus=16, ep=16, global_batch_size=1024),
    ("qwen3_30b_a3b", "h100", "fp8_cs"): _QWEN_H100_FP8_CS,
}
_WORKLOADS_05: dict[tuple[str, str, str], Workload] = {
    **_WORKLOADS_04,
    ("qwen3_30b_a3b", "gb300", "mxfp8"): dataclasses.replace(_QWEN_GB300, **_FULL_ITERATION),
    ("qwen3_30b_a3b", "gb200", "mxfp8"): dataclasses.replace(_QWEN_GB200, **_FULL_ITERATION),
    ("qwen3_30b_a3b", "b200", "mxfp8"): dataclasses.replace(_QWEN_B200, **_FULL_ITERATION),
}
WORKLOADS: dict[Minor, dict[tuple[str, str, str], Workload]] = {BRIDGE_04: _WORKLOADS_04, BRIDGE_05: _WORKLOADS_05}
"""Release -> (model, GPU, precision) -> the workload preset its perf run uses."""

FLEX_BACKENDS: dict[str, tuple[str, ...]] = {
    "gb300": ("hybridep",), "gb200": ("hybridep",), "b200": ("deepep", "hybridep"), "h200": ("deepep", "hybridep"),
    "h100": ("deepep", "hybridep"),
}
"""The flex dispatcher backends ``training/flex_dispatcher_backend.py`` ``apply_flex_dispatcher_backend`` accepts on
each GPU (DeepEP: SM 8.x / 9.x or a B200 / B300; HybridEP: SM 8.x-10.x); elsewhere it leaves the dispatcher as is."""

COMMON_FIELDS: dict[str, dict[str, Any]] = {
    # utils/overrides.py _set_common_perf_overrides (both tags)
    "train": {"train_iters": PERF_RUN_STEPS, "eval_iters": 0},
    "checkpoint": {"save": None},
    "logger": {"log_interval": 1, "tensorboard_dir": None},
    "ddp": {"check_for_nan_in_grad": False, "check_for_large_grads": False},
    "rerun_state_machine": {"check_for_nan_in_loss": False},
    "scheduler": {"lr_decay_iters": PERF_RUN_STEPS, "lr_warmup_iters": 10},
    "model": {"apply_rope_fusion": True, "cross_entropy_fusion_impl": "te"},
}
"""Fields every perf run sets after its workload preset."""
RUN_FIELDS: dict[str, dict[str, Any]] = {
    # perf_plugins.py PerfEnvPlugin: Hydra overrides train.manual_gc=true train.manual_gc_interval=100
    "train": {"manual_gc": True, "manual_gc_interval": 100},
}
"""Fields ``run_script.py`` sets after the builder (its options at their defaults)."""
MOCK_DATA_FIELDS: dict[str, dict[str, Any]] = {
    # utils/overrides.py set_user_overrides --data mock: utils/datasets.py create_mock_dataset_config's split (a real
    # corpus keeps the library's, as get_blend_fields_from_data_paths gives it)
    "dataset": {"split": "99990,8,2"},
}
MODEL_FIELDS: dict[str, dict[str, dict[str, Any]]] = {
    # configs/kimi/kimi_llm_pretrain.py set_kimi_k2_common_configs
    "kimi_k2": {
        "model": {"seq_length": 4096, "moe_router_fusion": True, "recompute_granularity": "selective",
                  "moe_router_force_load_balancing": True, "qk_clip": False},
        "dataset": {"sequence_length": 4096},
        "dist": {"enable_megatron_core_experimental": True},
        "mixed_precision": {"grad_reduce_in_fp32": False},
        "ddp": {"grad_reduce_in_fp32": False},
    },
    # configs/qwen/qwen3_llm_pretrain.py set_qwen3_common_configs
    "qwen3_30b_a3b": {
        "model": {"bias_activation_fusion": True, "recompute_granularity": None, "recompute_method": None,
                  "recompute_num_layers": None, "moe_router_fusion": True, "seq_length": 4096,
                  "moe_router_force_load_balancing": True},
        "dataset": {"sequence_length": 4096},
        "mixed_precision": {"grad_reduce_in_fp32": False},
        "ddp": {"grad_reduce_in_fp32": False},
    },
}
"""Each model's common perf fields (applied before the workload preset)."""
FULL_ITERATION_MOE_FIELDS: dict[str, Any] = {
    # v0.5.1 configs/qwen/qwen3_llm_pretrain.py set_full_iter_cg_configs (MXFP8 with a full-iteration graph)
    "offload_modules": [], "moe_pad_experts_for_cuda_graph_inference": True, "moe_paged_stash": True,
    "moe_expert_rank_capacity_factor": 1.5, "moe_paged_stash_buffer_size_factor_cuda": 1.2,
    "moe_paged_stash_buffer_size_factor_cpu": 1.0,
}
HYBRIDEP_NUM_SMS = 32
"""``moe_hybridep_num_sms`` of the perf runs with HybridEP (Megatron's default 16)."""
KIMI_LIBRARY_FLEX_BACKEND = "deepep"
"""The flex backend Bridge's Kimi K2 library recipe names; its perf builders apply it where the preset names none."""


def workload(recipe: Any, minor: Minor) -> Workload:
    """The workload preset of the Bridge release ``minor`` for ``recipe``'s (model, GPU, precision); a ValueError
    names the ones there are."""
    key = (recipe.model.name, recipe.system.gpu, recipe.precision.kind)
    table = WORKLOADS[minor]
    if key not in table:
        have = sorted({(m, g) for m, g, p in table if p == recipe.precision.kind})
        raise fail(f"(model, system.gpu) with precision.kind={recipe.precision.kind!r} (Megatron-Bridge "
                   f"{'.'.join(map(str, minor))} perf workloads)", key[:2], f"one of {have}")
    return table[key]


def _flex(fields: dict[str, dict[str, Any]], gpu: str, backend: str | None) -> None:
    """``apply_flex_dispatcher_backend(model, backend)`` as it ends on ``gpu``."""
    if backend in FLEX_BACKENDS.get(gpu, ()):
        fields["model"].update(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend=backend,
                               moe_shared_expert_overlap=False)


def perf_script_fields(recipe: Any, minor: Minor, *, base_optimizer: str) -> dict[str, dict[str, Any]]:
    """Section -> {field: value} the Bridge ``minor`` perf run of ``recipe``'s preset sets on its library recipe, in
    the scripts' order (``base_optimizer``: the library recipe's optimizer name, 'adam' or 'dist_muon'). The
    precision preset itself and Qwen3's new ``CommOverlapConfig(tp_comm_overlap=True)`` are the caller's (objects);
    ``set_post_overrides``' optimizer fields are left out (our optimizer replaces the library's)."""
    model, gpu, precision = recipe.model.name, recipe.system.gpu, recipe.precision.kind
    w = workload(recipe, minor)
    fields: dict[str, dict[str, Any]] = {"model": {}, "comm_overlap": {}, "rng": {}, "mixed_precision": {}}

    def put(values: dict[str, dict[str, Any]]) -> None:
        for section, items in values.items():
            fields.setdefault(section, {}).update(items)

    if model == "kimi_k2":  # the builder: its flex step before the common configs
        _flex(fields, gpu, w.moe_flex_dispatcher_backend or KIMI_LIBRARY_FLEX_BACKEND)
    else:  # the Qwen3 builder names the preset's backend on a flex dispatcher
        fields["model"].update(moe_flex_dispatcher_backend=w.moe_flex_dispatcher_backend,
                               moe_token_dispatcher_type="flex")
    put(MODEL_FIELDS[model])
    if model == "kimi_k2" and base_optimizer == "dist_muon" and precision == "mxfp8":
        # WAR: MXFP8's param all-gather needs the distributed optimizer, not Muon's layer-wise one
        fields["mixed_precision"].update(reuse_grad_buf_for_mxfp8_param_ag=False, fp8_param_gather=False)
    _workload_fields(fields, w, minor, gpu)
    if model == "kimi_k2":
        fields["comm_overlap"]["overlap_grad_reduce"] = gpu != "h100"
        if gpu == "gb300":
            fields["rng"]["te_rng_tracker"] = True
    elif minor >= BRIDGE_05 and precision == "mxfp8" and w.cuda_graph_impl == "full_iteration":
        fields["model"].update(FULL_ITERATION_MOE_FIELDS)
    put(RUN_FIELDS)
    if recipe.data.kind == "mock":
        put(MOCK_DATA_FIELDS)
    if minor >= BRIDGE_05:  # set_user_overrides repeats the CUDA-graph step without options
        _cuda_graph_fields(fields, minor, None, None)
    return {section: values for section, values in fields.items() if values}


def _cuda_graph_fields(fields: dict[str, dict[str, Any]], minor: Minor, impl: str | None,
                       scope: tuple[str, ...] | None) -> None:
    """utils/overrides.py ``_set_cuda_graph_overrides`` (the libraries' ``cuda_graph_impl`` is 'none')."""
    model = fields["model"]
    if impl is not None:
        model["cuda_graph_impl"] = impl
        if impl != "none" or minor < BRIDGE_05:  # v0.5.1 unsets the tracker below instead
            model["use_te_rng_tracker"] = fields["rng"]["te_rng_tracker"] = impl != "none"
    if scope is not None:
        model["cuda_graph_scope"] = list(scope)
    effective = model.get("cuda_graph_impl", "none")
    if minor >= BRIDGE_05 and effective == "none":
        model["cuda_graph_scope"] = []
        model["use_te_rng_tracker"] = fields["rng"]["te_rng_tracker"] = False
    if minor >= BRIDGE_05 and effective == "full_iteration":
        fields.setdefault("rerun_state_machine", {})["check_for_nan_in_loss"] = False


def _workload_fields(fields: dict[str, dict[str, Any]], w: Workload, minor: Minor, gpu: str) -> None:
    """utils/overrides.py ``set_workload_base_configs`` for the preset ``w``."""
    model = fields["model"]
    model.update(tensor_model_parallel_size=w.tp, pipeline_model_parallel_size=w.pp, context_parallel_size=1,
                 virtual_pipeline_model_parallel_size=w.vp, expert_model_parallel_size=w.ep,
                 expert_tensor_parallel_size=w.etp, sequence_parallel=w.tp > 1)
    fields.setdefault("train", {}).update(global_batch_size=w.global_batch_size, micro_batch_size=w.micro_batch_size)
    _cuda_graph_fields(fields, minor, w.cuda_graph_impl, w.cuda_graph_scope)
    if w.moe_a2a_overlap:
        fields["comm_overlap"].update(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)
        model["moe_shared_expert_overlap"] = False
    if w.cutedsl_fused_grouped_mlp:
        model.update(use_transformer_engine_op_fuser=True, moe_mlp_glu_interleave_size=32)
        if w.moe_a2a_overlap:
            model.update(high_priority_a2a_comm_stream=True, moe_hybridep_num_sms_preprocessing=32)
    if w.fp8_dot_product_attention is not None:
        fields["mixed_precision"]["fp8_dot_product_attention"] = w.fp8_dot_product_attention
    if w.recompute_modules is not None:
        model.update(recompute_modules=list(w.recompute_modules), recompute_granularity="selective")
    for section, values in COMMON_FIELDS.items():
        fields.setdefault(section, {}).update(values)
    if model.get("moe_flex_dispatcher_backend") == "hybridep":
        model["moe_hybridep_num_sms"] = HYBRIDEP_NUM_SMS
    if w.moe_flex_dispatcher_backend is not None:
        _flex(fields, gpu, w.moe_flex_dispatcher_backend)
    else:
        model["moe_token_dispatcher_type"] = "alltoall"
