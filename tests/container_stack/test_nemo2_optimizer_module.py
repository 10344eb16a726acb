"""NeMo 2.7's optimizer idiom with nemo-muon: `run.Config` optimizer recipes that serialize and keep their schedule,
and an `EmergingOptimizerModule` whose own ``optimizers()`` builds the optimizer on the Megatron CPU harness.

Runs in the container-stack environment (real NeMo 2.7, NeMo-Run 0.8, Megatron-Core 0.16)."""

from __future__ import annotations

import fiddle as fdl
import pytest
from nemo.collections import llm
from nemo.lightning import io
from nemo.lightning.pytorch.optim.lr_scheduler import CosineAnnealingScheduler, WarmupHoldAnnealScheduler
from nemo_run.core.serialization.yaml import YamlSerializer
from nemo_run.core.serialization.zlib_json import ZlibJSONSerializer

import nemo_muon
from nemo_muon.config.optimizer import AdamWConfig
from nemo_muon.megatron import nemo2
from nemo_muon.registry import specs
from tests.distributed import run_distributed
from tests.megatron_cpu.training import LR, NEMO2_MIN_LR, NEMO2_WARMUP_STEPS, train_tiny

RECIPES = {f"{spec.name}_{kind}": (spec.config_class, scheduler) for spec in specs()
           for kind, scheduler in (("with_cosine_annealing", CosineAnnealingScheduler),
                                   ("with_wsd", WarmupHoldAnnealScheduler))}
"""Every registered optimizer's two recipes, generated from its registry entry (`nemo2.optimizer_recipes`)."""


def _llama_recipe_with(optim):
    recipe = llm.llama3_8b.pretrain_recipe(name="nm", num_nodes=1, num_gpus_per_node=8)
    recipe.optim = optim
    return recipe


def test_reachable_from_the_package_root():
    assert nemo_muon.megatron.nemo2.muon_with_cosine_annealing is nemo2.muon_with_cosine_annealing
    assert isinstance(nemo2.muon_with_cosine_annealing(max_lr=2e-4), fdl.Config)
    assert set(RECIPES) <= set(nemo2.__all__) and {"muon_with_cosine_annealing", "soap_with_wsd",
                                                     "adamw_with_cosine_annealing"} <= set(RECIPES)
    # NeMo's Adam arguments land on each config's Adam fields; the other keywords are the config's own
    muon = fdl.build(nemo2.muon_with_wsd(adam_beta2=0.98, momentum=0.9, tp_mode="distributed")).optimizer_config
    assert (muon.adamw_betas, muon.momentum, muon.tp_mode, muon.scale_mode) == ((0.9, 0.98), 0.9, "distributed",
                                                                               "spectral")
    adamw = fdl.build(nemo2.adamw_with_cosine_annealing(adam_beta1=0.8, adam_eps=1e-5)).optimizer_config
    assert (adamw.betas, adamw.eps) == ((0.8, 0.95), 1e-5)
    # one meaning per name: `Muon` is the optimizer class (nemo_muon.Muon), not also a NeMo recipe function here
    assert not hasattr(nemo2, "Muon") and not hasattr(nemo2, "SOAP")


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_on_nemos_llama3_8b_serializes_and_keeps_its_schedule(name, tmp_path):
    config_cls, sched_cls = RECIPES[name]
    recipe = _llama_recipe_with(getattr(nemo2, name)(max_lr=3e-4, max_steps=1000))
    yaml_text = YamlSerializer().serialize(recipe.optim)
    assert "_target_: nemo_muon.megatron.nemo2.EmergingOptimizerModule" in yaml_text
    assert f"_target_: {sched_cls.__module__}.{sched_cls.__qualname__}" in yaml_text
    zlib = ZlibJSONSerializer()
    restored = zlib.deserialize(zlib.serialize(recipe))
    assert restored.optim == recipe.optim
    module = fdl.build(restored.optim)
    assert isinstance(module, nemo2.EmergingOptimizerModule)
    assert isinstance(module.optimizer_config, config_cls) and module.optimizer_config.lr == 3e-4
    assert isinstance(module.lr_scheduler, sched_cls) and module.lr_scheduler.max_steps == 1000
    assert module.config.lr == 3e-4 and module.config.clip_grad == 1.0  # the Megatron config NeMo reads
    # what NeMo's MegatronStrategy copies into its DDP config: ZeRO-1 Adam off for Muon (whole matrices), on for AdamW
    assert module.config.use_distributed_optimizer is (config_cls is AdamWConfig)
    # a checkpoint's context/ (NeMo's io_dump) and back
    module.io_dump(tmp_path, yaml_attrs=[])
    loaded = io.load(tmp_path)
    assert type(loaded) is nemo2.EmergingOptimizerModule and loaded.optimizer_config == module.optimizer_config
    assert type(loaded.lr_scheduler) is sched_cls and vars(loaded.lr_scheduler) == vars(module.lr_scheduler)


@pytest.mark.parametrize("kwargs, message", [
    ({"momentum": 1.5}, "momentum"),
    ({"tp_mode": "dup"}, "tp_mode must be one of"),
    ({"precision": "16-mixed"}, "precision must be 'bf16-mixed'"),
    ({"decay_schedule": "cosine"}, "decay_schedule must be one of ('linear', 'one_minus_square_root'); got 'cosine'"),
])
def test_bad_recipe_arguments_are_refused_when_the_recipe_is_made(kwargs, message):
    recipe = nemo2.muon_with_wsd if "decay_schedule" in kwargs else nemo2.muon_with_cosine_annealing
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        recipe(**kwargs)


@pytest.mark.parametrize("name, zero1", [("muon_with_cosine_annealing", True), ("adamw_with_cosine_annealing", False)])
def test_the_module_refuses_a_ddp_config_its_optimizer_cannot_use(name, zero1):
    from megatron.core.distributed import DistributedDataParallelConfig

    class Chunk:
        module = type("DDP", (), {"ddp_config": DistributedDataParallelConfig(use_distributed_optimizer=zero1)})()

    module = fdl.build(getattr(nemo2, name)())
    with pytest.raises(ValueError, match=f"trainer.strategy.ddp.use_distributed_optimizer must be {not zero1} for "
                                         f"optimizer '{module.optimizer_config.name}'"):
        module.optimizers([Chunk()])


@pytest.mark.parametrize("nonfinite, check, refused", [("skip", True, True), ("skip", False, False),
                                                       ("raise", True, False)])
def test_the_module_refuses_ddps_local_nan_check_beside_the_skip_policy(nonfinite, check, refused):
    """nonfinite='skip' decides on the global gradient norm on every rank; NeMo's DDP config with
    check_for_nan_in_grad=True (NeMo's recipes' default) would raise on the one rank that sees a NaN first."""
    from megatron.core.distributed import DistributedDataParallelConfig

    class Chunk:
        module = type("DDP", (), {"ddp_config": DistributedDataParallelConfig(check_for_nan_in_grad=check)})()

    module = fdl.build(nemo2.muon_with_cosine_annealing(nonfinite=nonfinite))
    if refused:
        with pytest.raises(ValueError, match=r"trainer.strategy.ddp.check_for_nan_in_grad must be False for "
                                             r"muon.nonfinite='skip'; got True"):
            module.optimizers([Chunk()])
    else:  # past the DDP checks, to the build, which needs the parallel state NeMo's strategy would have set up
        with pytest.raises(RuntimeError, match="Megatron's parallel_state is not initialized"):
            module.optimizers([Chunk()])


def test_module_builds_the_same_optimizer_as_the_builder_on_the_megatron_harness():
    """AdamW on Megatron-Core 0.16 through the module's own optimizers(): the loss curve equals the direct build
    bit for bit (same Megatron optimizer; NeMo's wrapper around it)."""
    direct = run_distributed(train_tiny, world_size=2, args=("tiny_qwen3_moe", "adamw", 4), timeout_s=240)[0]
    via_nemo = run_distributed(train_tiny, world_size=2, args=("tiny_qwen3_moe", "adamw", 4, (), None, None, None,
                                                               "nemo2"), timeout_s=240)[0]
    assert via_nemo["losses"] == direct["losses"]
    assert via_nemo["optimizers"] == direct["optimizers"] and via_nemo["replica_max_diff"] == 0.0


def test_nemos_scheduler_drives_the_module_built_optimizer():
    steps = 6
    result = run_distributed(train_tiny, world_size=2, args=("tiny_qwen3_moe", "adamw", steps, (), None, None, None,
                                                             "nemo2_cosine"), timeout_s=240)[0]
    # the reference: NeMo's own CosineAnnealing on a plain torch optimizer, stepped the same way
    import torch
    from nemo.core.optim.lr_scheduler import CosineAnnealing

    reference = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=LR)
    sched = CosineAnnealing(reference, max_steps=steps, warmup_steps=NEMO2_WARMUP_STEPS, constant_steps=0,
                            min_lr=NEMO2_MIN_LR)
    expected = []
    for _ in range(steps):
        expected.append(reference.param_groups[0]["lr"])
        reference.step()
        sched.step()
    assert expected[0] < expected[NEMO2_WARMUP_STEPS] and expected[-1] < expected[NEMO2_WARMUP_STEPS]  # a schedule
    assert result["lrs"] == pytest.approx(expected, rel=1e-12)
    assert result["losses"][-1] < result["losses"][0] and result["replica_max_diff"] == 0.0


@pytest.mark.parametrize("optimizer, ours", [("muon", "MegatronMuon"), ("soap", "MegatronSOAP")])
def test_muon_and_soap_through_the_module_train_on_this_stack(optimizer, ours):
    """Megatron-Core 0.16 + emerging-optimizers 0.3.0: the module's Muon / SOAP are nemo-muon's, inside Megatron's
    layer-wise optimizer (engine 'nemo_muon'), and train; Megatron's own Muon is refused with the fix."""
    result = run_distributed(train_tiny, world_size=2, args=("tiny_kimi_k2", optimizer, 8, (), None, None, None,
                                                             "nemo2"), timeout_s=300)[0]
    assert ours in result["optimizers"] and "NsBalancedLayerWiseOptimizer" in result["optimizers"]  # 0.16: by NS cost
    losses = result["losses"]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    assert result["replica_max_diff"] == 0.0
    with pytest.raises(ValueError, match=r"engine='megatron' cannot run on the installed stack:\n  - "
                                         r"\[mcore016-muon-emerging-optimizers\].*fix: use optimizer.engine=nemo_muon"):
        fdl.build(nemo2.muon_with_cosine_annealing(engine="megatron")).optimizers([])


def test_soap_checkpoint_through_the_module_resumes_bit_for_bit(tmp_path):
    """NeMo's strategy saves through the module's optimizer wrapper (`MegatronCoreOptimizer.sharded_state_dict`):
    SOAP's factors go through Megatron's dist_checkpointing keyed by parameter (`state_checkpoint`), and the resumed
    steps equal the uninterrupted run's."""
    args = ("tiny_qwen3_moe", "soap")
    straight = run_distributed(train_tiny, world_size=2, args=(*args, 3, (), str(tmp_path), 2, None, "nemo2"),
                               timeout_s=300, daemon=False)[0]
    resumed = run_distributed(train_tiny, world_size=2, args=(*args, 1, (), str(tmp_path), None, 2, "nemo2"),
                              timeout_s=300, daemon=False)[0]
    assert "MegatronSOAP" in resumed["optimizers"]
    assert resumed["losses"] == straight["losses"][2:]
