"""The Hugging Face config every Megatron-Bridge >= 0.4 builds a model from (``AutoBridge.from_hf_pretrained`` of the
Hub id its recipe names): the ids per model family, and the refusal of a recipe that names no local copy
(``recipe.hf_config``: clusters and this project's machines reach no Hub). Torch-free.
"""

from __future__ import annotations

HF_MODEL_IDS: dict[str, str] = {
    "kimi_k2": "moonshotai/Kimi-K2-Instruct",  # recipes/kimi/h100/kimi_k2.py (trust_remote_code=True)
    "qwen3_30b_a3b": "Qwen/Qwen3-30B-A3B",  # recipes/qwen/h100/qwen3_moe.py (_QWEN3_30B_A3B_MODEL_ID, a pinned revision)
}
"""The Hub id whose config.json Bridge 0.6's recipe of each model family reads."""


def missing_hf_config_message(model: str) -> str:
    """The refusal of a megatron recipe without ``hf_config`` on Bridge >= 0.4."""
    hub_id = HF_MODEL_IDS.get(model, "the model's Hub repository")
    return (f"hf_config must name a local folder holding {hub_id}'s Hugging Face config.json for Megatron-Bridge >= "
            f"0.4 (NGC 26.04 onwards), which builds the model from it and reaches no Hub here; got None: download "
            f"config.json of {hub_id} where a network is, and pass hf_config=<that folder>")
