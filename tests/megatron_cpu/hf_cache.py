"""An offline Hugging Face cache, so that nothing in the Bridge tests reaches the Hub (``HF_HUB_OFFLINE=1``).

Bridge's Qwen3-MoE recipes call ``AutoBridge.from_hf_pretrained("Qwen/Qwen3-30B-A3B")``
(``megatron/bridge/recipes/qwen/qwen3_moe.py:259`` at 0.3.0) to build the model provider from the Hub's
``config.json``; without Hub access or a cache they retry forever (``safe_config_loader.py:126``). nemo-muon's own
bases read the config.json it ships (`nemo_muon.megatron.bridge.hf_config`); tests that call Bridge directly
(``AutoBridge.from_hf_pretrained`` of the Hub id) find the same file laid out here as a cache snapshot.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from nemo_muon.megatron.bridge.hf_config import SHIPPED_HF_CONFIGS

CACHED_REPOS: dict[str, Path] = {"Qwen/Qwen3-30B-A3B": SHIPPED_HF_CONFIGS / "qwen3_30b_a3b" / "config.json"}
_SNAPSHOT = "0000000000000000000000000000000000000000"


def install_offline_hf_cache(root: Path) -> dict[str, str]:
    """Write the cache under ``root`` and return the environment variables that make HF read only from it."""
    hub = root / "hub"
    for repo, config in CACHED_REPOS.items():
        repo_dir = hub / ("models--" + repo.replace("/", "--"))
        snapshot = repo_dir / "snapshots" / _SNAPSHOT
        snapshot.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(config, snapshot / "config.json")
        (repo_dir / "refs").mkdir(exist_ok=True)
        (repo_dir / "refs" / "main").write_text(_SNAPSHOT)
    env = {"HF_HOME": str(root), "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    os.environ.update(env)
    return env
