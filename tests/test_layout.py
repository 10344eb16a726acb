"""Layout validation: Megatron-Core's constraints, each named in its error, and the pipeline placement."""

from __future__ import annotations

import pytest

from nemo_muon.accounting.layout import LayoutError, parse_pipeline_layout, pipeline_stage_layers, validate_layout
from nemo_muon.config.recipe import ParallelismConfig, SystemConfig, TrainerConfig, TrainingRecipe
from nemo_muon.models.specs import KIMI_K2, QWEN3_30B_A3B, TINY_QWEN3_MOE, ModelSpec


def kimi_recipe(**par: int) -> TrainingRecipe:
    p = dict(tp=1, pp=4, vp=4, cp=1, ep=64) | par
    return TrainingRecipe(name="kimi", model=KIMI_K2, parallelism=ParallelismConfig(**p),
                          system=SystemConfig(gpu="gb300", num_nodes=64, gpus_per_node=4),
                          trainer=TrainerConfig(global_batch_size=4096, micro_batch_size=2, seq_length=4096))


def qwen_recipe(**par: int) -> TrainingRecipe:
    return TrainingRecipe(name="qwen", model=QWEN3_30B_A3B, parallelism=ParallelismConfig(**(dict(ep=8) | par)),
                          system=SystemConfig(gpu="gb300", num_nodes=2, gpus_per_node=4),
                          trainer=TrainerConfig(global_batch_size=512, micro_batch_size=8, seq_length=4096))


def test_kimi_k2_bridge_layout_is_valid_and_uneven():
    lay = validate_layout(kimi_recipe())
    assert (lay.world_size, lay.dp, lay.edp, lay.num_microbatches) == (256, 64, 1, 32)
    assert lay.stage_layers == (4,) * 15 + (1,) and lay.uneven
    assert lay.layers_per_pp_rank == (16, 16, 16, 13)  # Bridge's _get_kimi_k2_pipeline_layout(4, 4)
    assert lay.pp_rank_layers(3)[:5] == [12, 13, 14, 15, 28] and lay.pp_rank_layers(3)[-1] == 60
    assert sorted(sum((lay.pp_rank_layers(r) for r in range(4)), [])) == list(range(61))
    assert lay.parallelism() == dict(tp=1, pp=4, vp=4, cp=1, ep=64, etp=1, dp=64, edp=1)


def test_qwen_layout_and_expert_data_parallel_size():
    lay = validate_layout(qwen_recipe())
    assert (lay.dp, lay.edp, lay.stage_layers, lay.uneven) == (8, 1, (48,), False)
    assert validate_layout(qwen_recipe(ep=4)).edp == 2
    assert validate_layout(qwen_recipe(), world_size=16).dp == 16


@pytest.mark.parametrize("recipe, world, pattern", [
    (kimi_recipe(), 250, r"world size must be a multiple of tp\*pp\*cp = 1\*4\*1 = 4 .*got 250"),
    (kimi_recipe(), 128, r"etp\*ep must divide tp\*cp\*dp .* = 32 ranks .*got etp\*ep = 1\*64 = 64"),
    (kimi_recipe(ep=40), None, r"ep must divide the number of experts \(384\) of kimi_k2; got ep=40"),
    (kimi_recipe(tp=3, pp=1, vp=1, ep=1), 255, r"tp must divide num_attention_heads \(64\); got tp=3"),
    (qwen_recipe(tp=8, ep=1), None, r"tp must divide num_query_groups \(4\); got tp=8"),
    (kimi_recipe(vp=1, pp=1, ep=8), 248, r"global_batch_size must be divisible by micro_batch_size\*dp = 2\*248"),
    (qwen_recipe(vp=2), None, r"parallelism.vp must be 1 unless pp > 1 .*; got pp=1, vp=2"),
    (qwen_recipe(cp=8, ep=1), None, None),  # valid: 4096 divisible by 2*8
    (kimi_recipe(pp=16, vp=4, ep=16), 256, r"every one of pp\*vp = 16\*4 = 64 virtual stages needs a decoder layer"),
    (qwen_recipe(etp=5, ep=1), 40, r"etp must divide moe_ffn_hidden_size \(768\); got etp=5"),
])
def test_invalid_layouts_name_the_constraint(recipe, world, pattern):
    if pattern is None:
        assert validate_layout(recipe, world).dp == 1
        return
    with pytest.raises(LayoutError, match=pattern):
        validate_layout(recipe, world)


def test_context_parallel_and_sequence_parallel_divisibility():
    r = qwen_recipe(cp=2, ep=1)
    r.trainer.seq_length = 4098
    with pytest.raises(LayoutError, match=r"seq_length must be divisible by 2\*cp = 4; got 4098"):
        validate_layout(r)
    r = qwen_recipe(tp=4, ep=1)
    r.parallelism.sequence_parallel = True
    r.trainer.seq_length = 4098
    with pytest.raises(LayoutError, match="seq_length / cp must be divisible by tp=4"):
        validate_layout(r)


def test_dense_model_rejects_expert_parallelism():
    dense = ModelSpec(name="dense", family="qwen3_moe", num_layers=2, hidden_size=64, vocab_size=256,
                      num_attention_heads=4, num_query_groups=2, head_dim=16, ffn_hidden_size=128)
    r = TrainingRecipe(name="d", model=dense, parallelism=ParallelismConfig(ep=2),
                       system=SystemConfig(gpu="cpu", gpus_per_node=2), trainer=TrainerConfig(global_batch_size=4))
    with pytest.raises(LayoutError, match="ep and etp must be 1 for the dense model dense; got ep=2"):
        validate_layout(r)


def test_uneven_pipeline_rule_reproduces_bridge_kimi_layouts():
    # Bridge's _get_kimi_k2_pipeline_layout: (4,1) 16/16/16/13; (8,1) 8 x 7 + 5; (16,1) and (4,4) 4 x 15 + 1.
    assert pipeline_stage_layers(61, 4) == ((16, 16, 16, 13), True)
    assert pipeline_stage_layers(61, 8) == ((8,) * 7 + (5,), True)
    assert pipeline_stage_layers(61, 16) == pipeline_stage_layers(61, 4, 4) == ((4,) * 15 + (1,), True)
    assert pipeline_stage_layers(48, 2, 12) == ((2,) * 24, False)
    with pytest.raises(LayoutError, match="leaves the last stage empty"):
        pipeline_stage_layers(9, 4)


def test_explicit_pipeline_layout_string_and_list():
    assert parse_pipeline_layout("Et|(tt|)*30L") == (1,) + (2,) * 30 + (0,)
    assert parse_pipeline_layout("Et*4|(t*4|)*14t,L") == (4,) * 15 + (1,)
    with pytest.raises(LayoutError, match="parallelism.pipeline_layout must use only"):
        parse_pipeline_layout("Ex|t")
    r = kimi_recipe()
    lay = validate_layout(r, stage_layers="Et*4|(t*4|)*14t,L")
    assert lay.layers_per_pp_rank == (16, 16, 16, 13)
    assert validate_layout(r, stage_layers=[4] * 15 + [1]).stage_layers == lay.stage_layers
    with pytest.raises(LayoutError, match=r"pp\*vp = 4\*4 = 16 virtual stages whose decoder layers sum to"):
        validate_layout(r, stage_layers=[4] * 16)


def test_tiny_recipe_on_cpu():
    r = TrainingRecipe(name="t", model=TINY_QWEN3_MOE, parallelism=ParallelismConfig(ep=2),
                       system=SystemConfig(gpu="cpu", gpus_per_node=4), trainer=TrainerConfig(global_batch_size=8))
    lay = validate_layout(r)
    assert (lay.dp, lay.edp, lay.num_microbatches) == (4, 2, 2)


def test_recipe_pipeline_layout_field_is_used_when_present():
    r = kimi_recipe(pp=16, vp=2, tp=8, ep=64)
    r.system.num_nodes = 256  # 1024 GPUs: Bridge's H100 preset, whose layout ends in a loss-only stage
    r.trainer.global_batch_size = 8192
    with pytest.raises(LayoutError, match="etp\\*ep must divide"):
        validate_layout(r, 512)
    r.parallelism.pipeline_layout = "Et|(tt|)*30L"  # the field the recipes may carry (read with getattr)
    lay = validate_layout(r)
    assert lay.stage_layers[0] == 1 and lay.stage_layers[-1] == 0 and lay.pp_rank_layers(15) == [29, 30]
    assert lay.pp_rank_layers(0) == [0, 31, 32] and lay.layers_per_pp_rank == (3,) + (4,) * 14 + (2,)
