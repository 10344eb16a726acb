"""Plain, validated configuration dataclasses (torch-free)."""

from nemo_muon.config.optimizer import AdamWConfig, BaseOptimizerConfig, MuonConfig, SoapConfig
from nemo_muon.config.recipe import (
    CheckpointConfig,
    DataConfig,
    LoggingConfig,
    ParallelismConfig,
    PrecisionConfig,
    SchedulerConfig,
    SystemConfig,
    TrainerConfig,
    TrainingRecipe,
)

__all__ = [
    "AdamWConfig",
    "CheckpointConfig",
    "DataConfig",
    "LoggingConfig",
    "MuonConfig",
    "BaseOptimizerConfig",
    "ParallelismConfig",
    "PrecisionConfig",
    "SchedulerConfig",
    "SoapConfig",
    "SystemConfig",
    "TrainerConfig",
    "TrainingRecipe",
]
