"""The Hugging Face config.json a Megatron-Bridge library or perf recipe builds its model from, read offline.

Bridge's recipes build the model provider with ``AutoBridge.from_hf_pretrained(<Hub id>)`` (Bridge 0.3's Qwen3 library
recipe, every recipe of Bridge >= 0.4), which reaches the Hub; clusters and this project's machines reach none. So the
public config.json of each megatron model family ships with nemo-muon (``nemo_muon/models/hf_configs/<model>/``,
package data), and `hf_config_folder` is the one answer to "which folder does this run read": ``recipe.hf_config``
when set (an override: another local copy), else the shipped one; without either the recipe is refused naming the
field. `local_hf_config` makes the Hub id a recipe asks for load from that folder while the recipe function runs.

Kimi K2's shipped config is in DeepseekV3 form (``model_type: deepseek_v3``): the Hub's config.json names remote code
(``trust_remote_code``) for the same architecture numbers. Torch-free until `local_hf_config` is entered.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HF_MODEL_IDS: dict[str, str] = {
    "kimi_k2": "moonshotai/Kimi-K2-Instruct",  # recipes/kimi/kimi_k2.py (trust_remote_code=True)
    "qwen3_30b_a3b": "Qwen/Qwen3-30B-A3B",  # recipes/qwen/qwen3_moe.py (0.6: _QWEN3_30B_A3B_MODEL_ID, a pinned revision)
}
"""The Hub id whose config.json Bridge's recipes of each model family read."""
SHIPPED_HF_CONFIGS = Path(__file__).resolve().parents[2] / "models" / "hf_configs"
"""``<model>/config.json`` for every model of `HF_MODEL_IDS` (declared package data in pyproject.toml)."""


def shipped_hf_config(model: str) -> str | None:
    """The folder holding the config.json nemo-muon ships for ``model`` (a ModelSpec name), None if it ships none."""
    folder = SHIPPED_HF_CONFIGS / model
    return str(folder) if (folder / "config.json").is_file() else None


def missing_hf_config_message(model: str) -> str:
    """The refusal of a megatron recipe whose model has no config.json here: neither ``hf_config`` nor a shipped one."""
    hub_id = HF_MODEL_IDS.get(model, "the model's Hub repository")
    return (f"hf_config must name a local folder holding {hub_id}'s Hugging Face config.json (Megatron-Bridge builds "
            f"the model from it and reaches no Hub here; nemo-muon ships none for model {model!r}); got None: download "
            f"config.json of {hub_id} where a network is, and pass hf_config=<that folder>")


def hf_config_folder(recipe: Any) -> str:
    """The folder whose config.json a megatron run of ``recipe`` builds its model from: ``recipe.hf_config`` (an
    override), else the one nemo-muon ships for the model; a ValueError names the field when there is neither."""
    if recipe.hf_config is not None:
        return recipe.hf_config
    shipped = shipped_hf_config(recipe.model.name)
    if shipped is None:
        raise ValueError(missing_hf_config_message(recipe.model.name))
    return shipped


def check_hf_config_dir(field: str, path: str) -> None:
    """Raise unless ``path`` is a folder holding a ``config.json`` (``field`` names the recipe field)."""
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(f"{field}={path!r} must be a folder holding the model's Hugging Face config.json (Megatron-"
                         "Bridge builds the model from it); no config.json there")


@contextmanager
def local_hf_config(hub_id: str, folder: str) -> Iterator[None]:
    """While the block runs, Bridge's ``AutoBridge.from_hf_pretrained(hub_id, ...)`` loads ``folder`` instead (a pinned
    ``revision`` of the Hub id does not apply to a local folder and is dropped); other ids are untouched."""
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    check_hf_config_dir("hf_config", folder)
    original = AutoBridge.__dict__["from_hf_pretrained"]
    load = original.__func__

    def from_local(cls: type, path: Any, *args: Any, **kwargs: Any) -> Any:
        if path == hub_id:
            kwargs.pop("revision", None)
            path = folder
        return load(cls, path, *args, **kwargs)

    AutoBridge.from_hf_pretrained = classmethod(from_local)
    try:
        yield
    finally:
        AutoBridge.from_hf_pretrained = original


@contextmanager
def recipe_hf_config(recipe: Any) -> Iterator[None]:
    """`local_hf_config` for ``recipe``'s model and the folder `hf_config_folder` resolves."""
    with local_hf_config(HF_MODEL_IDS[recipe.model.name], hf_config_folder(recipe)):
        yield
