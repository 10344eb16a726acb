"""Tiny CPU recipes of the torch backend: Kimi-K2-family (DeepseekV3: MLA, MoE + shared expert, dense first
layer) and Qwen3-MoE models of a few million parameters, pretrained on the Python stdlib source on 2 gloo ranks.

All share `_tiny_base` (the one place their defaults live); each variant changes only the model and optimizer.
Learning-rate transfer: Muon runs with ``scale_mode='match_rms_adamw'`` (update RMS 0.2, like AdamW's), which
lets it reuse the AdamW baseline's learning rate and weight decay unchanged (docs/cpu_pipeline.md).
"""

from __future__ import annotations

from nemo_muon.recipes import recipe

from nemo_muon.config.optimizer import AdamWConfig, BaseOptimizerConfig, MuonConfig, SoapConfig
from nemo_muon.config.recipe import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    PrecisionConfig,
    SchedulerConfig,
    SystemConfig,
    TrainerConfig,
    TrainingRecipe,
)
from nemo_muon.models.specs import TINY_KIMI_K2, TINY_QWEN3_MOE, ModelSpec
from nemo_muon.registry.normuon import NorMuonConfig

TINY_LR = 6e-3
"""Peak learning rate shared by AdamW and Muon (match_rms_adamw): AdamW's best of {1e-3, 3e-3, 6e-3} on both tiny
models (final val loss, 150 steps; bench/results/train_cpu.md); Muon takes it unchanged (the transfer rule)."""
TINY_WEIGHT_DECAY = 0.1


def _tiny_base(name: str, model: ModelSpec, optimizer: BaseOptimizerConfig) -> TrainingRecipe:
    return TrainingRecipe(
        name=name,
        model=model,
        optimizer=optimizer,
        backend="torch",
        system=SystemConfig(gpu="cpu", num_nodes=1, gpus_per_node=2),
        # 150 steps x 64 windows x 128 tokens = 1.2 M tokens (about a third of the stdlib corpus, no repeats);
        # validation every 10 steps on 64 held-out windows (8 k tokens) gives the loss curves their resolution.
        trainer=TrainerConfig(max_steps=150, global_batch_size=64, micro_batch_size=8, seq_length=128,
                              grad_clip=1.0, eval_interval=10, eval_iters=1, log_interval=1, seed=1234),
        scheduler=SchedulerConfig(kind="cosine", warmup_steps=10, min_lr_ratio=0.1),
        data=DataConfig(kind="stdlib_text", val_fraction=0.05),
        precision=PrecisionConfig(kind="fp32"),  # bf16 autocast is slower than fp32 on CPUs without AVX512-BF16
        checkpoint=CheckpointConfig(save_interval=0),
        logging=LoggingConfig(root="runs"),
    )


def _muon() -> MuonConfig:
    return MuonConfig(lr=TINY_LR, weight_decay=TINY_WEIGHT_DECAY, scale_mode="match_rms_adamw")


def _adamw() -> AdamWConfig:
    return AdamWConfig(lr=TINY_LR, weight_decay=TINY_WEIGHT_DECAY)


@recipe
def tiny_kimi_k2_muon() -> TrainingRecipe:
    """Tiny Kimi K2 (DeepseekV3) with layer-wise Muon on 2 CPU ranks."""
    return _tiny_base("tiny_kimi_k2_muon", TINY_KIMI_K2, _muon())


@recipe
def tiny_kimi_k2_adamw() -> TrainingRecipe:
    """Tiny Kimi K2 (DeepseekV3) with layer-wise AdamW on 2 CPU ranks: the baseline of tiny_kimi_k2_muon."""
    return _tiny_base("tiny_kimi_k2_adamw", TINY_KIMI_K2, _adamw())


@recipe
def tiny_kimi_k2_soap() -> TrainingRecipe:
    """Tiny Kimi K2 (DeepseekV3) with layer-wise SOAP on 2 CPU ranks."""
    return _tiny_base("tiny_kimi_k2_soap", TINY_KIMI_K2, SoapConfig(lr=TINY_LR, weight_decay=TINY_WEIGHT_DECAY))


@recipe
def tiny_kimi_k2_normuon() -> TrainingRecipe:
    """Tiny Kimi K2 (DeepseekV3) with layer-wise NorMuon (Muon + row-wise second moment) on 2 CPU ranks: Muon's
    settings, so it differs from tiny_kimi_k2_muon by the update only."""
    muon = _muon()
    return _tiny_base("tiny_kimi_k2_normuon", TINY_KIMI_K2, NorMuonConfig(lr=muon.lr, weight_decay=muon.weight_decay,
                                                                           scale_mode=muon.scale_mode))


@recipe
def tiny_qwen3_moe_muon() -> TrainingRecipe:
    """Tiny Qwen3-MoE with layer-wise Muon on 2 CPU ranks."""
    return _tiny_base("tiny_qwen3_moe_muon", TINY_QWEN3_MOE, _muon())


@recipe
def tiny_qwen3_moe_adamw() -> TrainingRecipe:
    """Tiny Qwen3-MoE with layer-wise AdamW on 2 CPU ranks: the baseline of tiny_qwen3_moe_muon."""
    return _tiny_base("tiny_qwen3_moe_adamw", TINY_QWEN3_MOE, _adamw())
