"""An offline Hugging Face cache holding the one file Megatron-Bridge 0.3.0's Qwen3-MoE library recipe reads.

`qwen3_30b_a3b_pretrain_config` calls ``AutoBridge.from_hf_pretrained("Qwen/Qwen3-30B-A3B")``
(``megatron/bridge/recipes/qwen/qwen3_moe.py:259``) to build its model provider from the Hub's ``config.json``; in
the container that needs Hub access or a cache, and without either it retries forever
(``safe_config_loader.py:126``). Tests lay out ``tests/data/qwen3_30b_a3b_config.json`` (the public config of
Qwen/Qwen3-30B-A3B, whose architecture numbers `nemo_muon.models.specs.QWEN3_30B_A3B` also states) as a cache
snapshot and set ``HF_HUB_OFFLINE=1``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

DATA = Path(__file__).resolve().parent.parent / "data"
CACHED_REPOS: dict[str, Path] = {"Qwen/Qwen3-30B-A3B": DATA / "qwen3_30b_a3b_config.json"}
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
