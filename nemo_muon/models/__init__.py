"""Model architectures as data (torch-free) and their conversions."""

from nemo_muon.models.specs import KIMI_K2, MODEL_SPECS, QWEN3_30B_A3B, ModelSpec, get_model_spec

__all__ = ["KIMI_K2", "MODEL_SPECS", "QWEN3_30B_A3B", "ModelSpec", "get_model_spec"]
