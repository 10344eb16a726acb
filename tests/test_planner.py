"""The planner on recipes built here: FLOPs, per-rank NS work, imbalance, optimizer state, gathers, MFU."""

from __future__ import annotations

import pytest

from nemo_muon.accounting.gpu_peaks import (
    GpuPeak,
    gpu_peak,
    known_gpus,
    load_gpu_peaks,
    mfu,
    register_gpu_peak,
    tflops_per_gpu,
    throughput,
)
from nemo_muon.accounting.ns_count import matrix_ns_flops, ns_flops
from nemo_muon.accounting.planner import plan_recipe
from nemo_muon.config.optimizer import AdamWConfig, MuonConfig
from nemo_muon.config.recipe import ParallelismConfig, SystemConfig, TrainerConfig, TrainingRecipe
from nemo_muon.models.matrices import matrix_params, param_counts
from nemo_muon.models.specs import KIMI_K2, QWEN3_30B_A3B, TINY_QWEN3_MOE


def kimi(**opt: object) -> TrainingRecipe:
    return TrainingRecipe(name="kimi", model=KIMI_K2, optimizer=MuonConfig(**opt),
                          parallelism=ParallelismConfig(tp=1, pp=4, vp=4, cp=1, ep=64),
                          system=SystemConfig(gpu="gb300", num_nodes=64, gpus_per_node=4),
                          trainer=TrainerConfig(global_batch_size=4096, micro_batch_size=2, seq_length=4096))


def tiny(optimizer=None, layerwise=True, **par: object) -> TrainingRecipe:
    return TrainingRecipe(name="tiny", model=TINY_QWEN3_MOE, optimizer=optimizer or MuonConfig(),
                          parallelism=ParallelismConfig(**par), layerwise=layerwise,
                          system=SystemConfig(gpu="cpu", gpus_per_node=4),
                          trainer=TrainerConfig(global_batch_size=8, micro_batch_size=1, seq_length=64))


def test_kimi_k2_plan_on_256_gb300():
    p = plan_recipe(kimi())
    assert p["world_size"] == 256 and p["parallelism"]["dp"] == 64 and p["layers_per_pp_rank"] == [16, 16, 16, 13]
    assert p["model_flops_per_step"] == pytest.approx(3.4306e18, rel=1e-4)
    assert p["ns_flops_per_step"] == pytest.approx(4.85e16, rel=0.005)
    # TP1: nothing repeated, so the per-rank loads add up to the useful count
    assert p["ns_flops_executed_per_step"] == pytest.approx(p["ns_flops_per_step"], rel=1e-12)
    assert p["ns_flops_per_rank_mean"] * 256 == pytest.approx(p["ns_flops_per_step"], rel=1e-12)
    # experts are pinned to their EP rank (edp = 1): the 13-layer stage carries 13 layers x 6 experts on every rank
    expert = 2 * matrix_ns_flops((2048, 7168)) + matrix_ns_flops((7168, 2048))
    assert p["ns_flops_per_pp_rank_min"][3] >= 13 * 6 * expert
    assert p["ns_flops_per_pp_rank_max"][0] >= 15 * 6 * expert
    # the 16/16/16/13 layout alone bounds the balance (DESIGN: >= ~1.065); LPT keeps each stage close to even
    assert p["ns_imbalance"] >= 1.065
    assert 1.0 <= p["ns_imbalance_within_stage_max"] <= p["ns_imbalance"]
    assert p["ns_time_per_step_s_at_peak"] == pytest.approx(p["ns_flops_per_rank_max"] / 2500e12)
    by = p["optimizer_state_bytes_per_rank_by_optimizer"]
    assert by["muon"] < by["adamw"] < by["soap"] and p["optimizer_state_bytes_per_rank"] == by["muon"]
    assert p["param_gather_bytes_per_step"] > 0


def test_fused_gate_up_and_syrk_change_the_ns_count():
    fused = plan_recipe(kimi(split_gate_up=False))
    assert fused["ns_flops_per_step"] == pytest.approx(8.82e16, rel=0.005)
    assert "gate/up fused" in fused["counting_rule"]
    syrk = plan_recipe(kimi(), syrk=True)
    assert syrk["ns_flops_per_step"] == pytest.approx(3.48e16, rel=0.01)


def test_blog_arithmetic_from_a_step_time():
    # 1,029 model TFLOP/s/GPU on 256 GPUs means a 13.02 s step for 3.4306e18 FLOPs.
    p = plan_recipe(kimi(), step_time_s=13.02)
    assert p["model_tflops_per_gpu"] == pytest.approx(1029.2, abs=0.5)
    assert p["model_plus_ns_tflops_per_gpu"] == pytest.approx(p["model_tflops_per_gpu"] + 4.85e16 / 13.02 / 256e12,
                                                              rel=1e-3)
    assert p["mfu_model"] == pytest.approx(1029.2 / 5000, abs=1e-3)  # MXFP8 recipe -> dense fp8 peak
    assert p["mfu_peak"] == "gb300 dense fp8"


def test_duplicated_tp_repeats_work_and_blockwise_does_not():
    dup = plan_recipe(tiny(tp=2, etp=2))
    assert dup["ns_flops_executed_per_step"] == pytest.approx(2 * dup["ns_flops_per_step"])
    assert dup["ns_flops_per_rank_mean"] * 4 == pytest.approx(dup["ns_flops_executed_per_step"])
    # etp=1: the experts are regrouped as 4 expert-DP replicas and not repeated; the rest is repeated on 2 TP ranks
    mixed = plan_recipe(tiny(tp=2, etp=1))
    assert mixed["ns_flops_executed_per_step"] == pytest.approx(
        ns_flops(matrix_params(TINY_QWEN3_MOE), tp=2, etp=1).executed)
    assert dup["ns_flops_per_step"] < mixed["ns_flops_executed_per_step"] < dup["ns_flops_executed_per_step"]
    block = plan_recipe(tiny(optimizer=MuonConfig(tp_mode="blockwise"), tp=2, etp=2))
    assert block["ns_flops_per_step"] == dup["ns_flops_per_step"]
    assert block["ns_flops_executed_per_step"] < dup["ns_flops_executed_per_step"]


def test_layerwise_spreads_ns_and_replicated_repeats_it():
    lw = plan_recipe(tiny())
    rep = plan_recipe(tiny(optimizer=MuonConfig(engine="megatron"), layerwise=False))  # Megatron's replicated Muon
    assert rep["ns_flops_per_rank_max"] == rep["ns_flops_per_rank_mean"] == pytest.approx(lw["ns_flops_per_step"])
    assert lw["ns_flops_per_rank_mean"] == pytest.approx(lw["ns_flops_per_step"] / 4)
    assert lw["ns_flops_per_rank_max"] < rep["ns_flops_per_rank_max"] / 2
    assert rep["param_gather_bytes_per_step"] == 0 and lw["param_gather_bytes_per_step"] > 0
    assert rep["optimizer_state_bytes_per_rank"] > lw["optimizer_state_bytes_per_rank"]


def test_adamw_state_and_gather_follow_the_distributed_optimizer():
    p = plan_recipe(tiny(optimizer=AdamWConfig(), layerwise=False))
    total, _ = param_counts(TINY_QWEN3_MOE)
    assert p["ns_flops_per_step"] == p["ns_flops_per_rank_max"] == 0 and p["optimizer"] == "adamw"
    assert p["optimizer_state_bytes_per_rank"] == pytest.approx(12 * total / 4)  # fp32 master + m + v over DP4
    assert p["param_gather_bytes_per_step"] == pytest.approx(2 * total * 3 / 4)  # bf16, all but the own quarter
    assert p["params_per_rank_max"] == total


def test_qwen_plan_and_world_size_override():
    r = TrainingRecipe(name="qwen", model=QWEN3_30B_A3B, parallelism=ParallelismConfig(ep=8),
                       system=SystemConfig(gpu="gb300", num_nodes=2, gpus_per_node=4),
                       trainer=TrainerConfig(global_batch_size=512, micro_batch_size=8, seq_length=4096))
    p = plan_recipe(r)
    assert p["model_flops_per_step"] == pytest.approx(4.8248e16, rel=1e-4)
    assert p["ns_flops_per_step"] == pytest.approx(5.71e14, rel=0.005)
    assert p["ns_imbalance"] >= 1.0 and p["model_params"] == param_counts(QWEN3_30B_A3B)[0]
    p16 = plan_recipe(r, 16)
    assert p16["parallelism"]["edp"] == 2 and p16["ns_flops_per_rank_max"] < p["ns_flops_per_rank_max"]
    with pytest.raises(ValueError, match="global_batch_size must be divisible by micro_batch_size"):
        plan_recipe(r, 128)


def test_gpu_peak_table_functions(tmp_path):
    assert {"h100", "h200", "b200", "gb200", "gb300"} <= set(known_gpus())
    assert gpu_peak("GB300").tflops("fp8") == 2 * gpu_peak("gb300").tflops("bf16")
    assert tflops_per_gpu(1e15, 2.0, 5) == 100.0
    with pytest.raises(ValueError, match="num_gpus must be an integer >= 1; got 2.5"):
        tflops_per_gpu(1e15, 2.0, 2.5)
    assert mfu(989.5e12 * 8, 1.0, 8, "h100") == pytest.approx(1.0)
    t = throughput(3e18, 1e17, 10.0, 300, "b200", "bf16")
    assert t.total_tflops == pytest.approx(1000 + 100 / 3) and t.mfu_model == pytest.approx(1000 / 2250)
    register_gpu_peak(GpuPeak("test_gpu_a", 100.0, 200.0, "test"), replace=True)
    assert gpu_peak("test_gpu_a").fp8 == 200.0
    with pytest.raises(ValueError, match="gpu must be a name not already in the peak table"):
        register_gpu_peak(GpuPeak("test_gpu_a", 1.0, 2.0))
    f = tmp_path / "peaks.yaml"
    f.write_text("test_gpu_b: {bf16: 50, fp8: 100, source: lab sheet}\n")
    assert load_gpu_peaks(f) == ["test_gpu_b"] and gpu_peak("test_gpu_b").bf16 == 50
    f.write_text("test_gpu_c: {bf16: 50}\n")
    with pytest.raises(ValueError, match=r"peaks.yaml: test_gpu_c must be a mapping with keys bf16, fp8 \(and source\); "
                                         r"got \{'bf16': 50\}"):
        load_gpu_peaks(f)
    f.write_text("test_gpu_d: {bf16: 50, fp8: 100}\ntest_gpu_e: [\n")
    with pytest.raises(ValueError, match=r"gpu peak file .*peaks.yaml must be a readable YAML file; got \(ParserError"):
        load_gpu_peaks(f)
    assert "test_gpu_d" not in known_gpus()  # all or none
    with pytest.raises(ValueError, match="gpu must be one of"):
        gpu_peak("tpu")
    with pytest.raises(ValueError, match=r"gpu_peak\[x\].bf16 must be a number in \(0.0, inf\)"):
        GpuPeak("x", 0.0, 1.0)


@pytest.mark.parametrize("recipe_name, layout", [
    ("kimi_k2_muon", {"dp": 64, "pp": 4, "ep": 64, "layers_per_stage": (16, 16, 16, 13)}),
    ("kimi_k2_muon_split", {"dp": 64, "pp": 4, "ep": 64, "layers_per_stage": (16, 16, 16, 13)}),
    ("qwen3_30b_a3b_muon", {"dp": 8, "ep": 8}),
])
def test_planner_ns_load_equals_the_layerwise_model_plan(recipe_name, layout):
    """`nemo-muon plan` and `model_plan` (bench, docs) give the same per-rank NS load for the recipe as configured:
    the recipe's VP4 interleaved layer placement and model_plan's consecutive 16/16/16/13 stages hold the same
    layers per PP rank (the dense layer 0 on PP rank 0), and both cost gate/up as the recipe does (fused). Kimi K2's
    split recipe opts in to split ownership at 1.02 (whole tensors: 1.108 within a stage); the others run whole
    tensors, and the plan shows what the split would give."""
    from nemo_muon.recipes import get_recipe

    from nemo_muon.accounting.model_ownership import model_plan

    recipe = get_recipe(recipe_name)
    opt = recipe.optimizer
    assert not opt.split_gate_up  # the megatron backend orthogonalizes linear_fc1 fused
    p = plan_recipe(recipe)
    kw = {"split_gate_up": opt.split_gate_up, "split_qkv": opt.split_qkv, "ns_steps": opt.ns_steps, **layout}
    target = opt.ns_split_target
    mp = model_plan(recipe.model, balance_target=target, split_gather_update=True, **kw)
    assert p["ns_flops_per_rank_max"] == pytest.approx(mp.max_rank_flops, rel=1e-12)
    assert p["ns_imbalance"] == pytest.approx(mp.global_imbalance, rel=1e-12)
    assert p["ns_imbalance_within_stage_max"] == pytest.approx(mp.within_stage_imbalance, rel=1e-12)
    split = p["ns_split"]
    assert split["executed"] is (target is not None)
    assert (split["note"] is None) if target is not None else "ns_split_target is None" in split["note"]
    mp = model_plan(recipe.model, balance_target=split["target"], split_gather_update=True, **kw)
    assert split["ns_flops_per_rank_max"] == pytest.approx(mp.max_rank_flops, rel=1e-12)
    assert split["ns_imbalance_within_stage_max"] == pytest.approx(mp.within_stage_imbalance, rel=1e-12)
    assert split["ns_imbalance_within_stage_max"] <= split["target"] == 1.02
    assert split["ns_imbalance_layout_bound"] <= split["ns_imbalance"]
    whole = model_plan(recipe.model, **kw)
    if recipe_name == "kimi_k2_muon_split":
        assert target == 1.02
        # stage 0: 15 MoE layers x 6 pinned experts on every rank, plus the dense layer's fused fc1 on one of them
        expert = matrix_ns_flops((4096, 7168)) + matrix_ns_flops((7168, 2048))
        assert p["ns_flops_per_pp_rank_max"][0] >= 15 * 6 * expert + matrix_ns_flops((36864, 7168)) / 64
        assert 1.06 < split["ns_imbalance_layout_bound"] < split["ns_imbalance"] < whole.global_imbalance
        assert split["split_matrices"] > 0 and split["extra_bytes_per_rank_max"] > 0
        assert p["ns_imbalance_within_stage_max"] <= 1.02 < 1.1 < whole.within_stage_imbalance
    elif recipe_name == "kimi_k2_muon":  # whole tensors (the default path); the plan shows what the split would give
        assert target is None and p["ns_imbalance_within_stage_max"] == whole.within_stage_imbalance > 1.1
        assert split["split_matrices"] > 0 and split["ns_imbalance_within_stage_max"] <= 1.02
    else:  # Qwen3-30B-A3B on 8 balances without a split
        assert target is None and p["ns_imbalance_within_stage_max"] == whole.within_stage_imbalance <= 1.005
        assert split["split_matrices"] == 0


def test_split_gate_up_is_costed_per_part_but_owned_as_one_tensor():
    """Splitting gate/up changes what NS costs, not the ownership unit: a stored tensor has one owner."""
    from nemo_muon.accounting.layout import validate_layout
    from nemo_muon.accounting.model_ownership import CostModel, stage_plan

    r = tiny()
    layout = validate_layout(r)
    split = stage_plan(r.model, layout, 0, cost=CostModel(split_gate_up=True))
    fused = stage_plan(r.model, layout, 0, cost=CostModel(split_gate_up=False))
    name = "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight"
    assert name in split.plan.owners and not any("[" in n for n in split.plan.owners)  # EP = 1: a dense tensor
    cost = {t.item.name: t.item.cost for t in split.tensors}
    assert cost[name] == pytest.approx(2 * matrix_ns_flops((96, 128)))
    assert {t.item.name: t.item.cost for t in fused.tensors}[name] == pytest.approx(matrix_ns_flops((192, 128)))
    assert sum(split.gpu_flops) == pytest.approx(plan_recipe(r)["ns_flops_executed_per_step"])


def test_split_members_hold_the_whole_matrix_inside_megatron_but_a_slice_in_the_whole_tensor_optimizer():
    """Optimizer state of split ownership: inside Megatron-Core 0.16 every member of a block keeps the split
    matrix's whole master and momentum; the whole-tensor optimizer keeps one slice per member. The difference on each rank is
    exactly its split matrices' (ways - 1) / ways elements."""
    from nemo_muon.accounting.layout import validate_layout
    from nemo_muon.accounting.model_ownership import CostModel, stage_plan
    from nemo_muon.accounting.planner import _stage_ranks

    r = kimi(split_gate_up=False)
    layout = validate_layout(r)
    sp = stage_plan(r.model, layout, 0, cost=CostModel(split_gate_up=False, split_gather_update=True),
                    balance_target=1.02)
    assert sp.plan.splits  # stage 0's dense fc1 and friends are split
    whole = _stage_ranks(layout, sp, True, split_held_whole=True)
    slices = _stage_ranks(layout, sp, True, split_held_whole=False)
    numel = {t.item.name: t.item.numel for t in sp.tensors}
    for gpu, (w, s) in enumerate(zip(whole, slices, strict=True)):
        b = gpu // layout.tp
        extra = sum(numel[n] - numel[n] // split.option.ways for n, split in sp.plan.splits.items() if b in split.ranks)
        assert w.owned_hidden - s.owned_hidden == extra
    assert any(w.owned_hidden > s.owned_hidden for w, s in zip(whole, slices, strict=True))
