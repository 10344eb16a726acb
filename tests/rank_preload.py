"""What the forkserver of the tests' gloo ranks imports once (`tests.distributed`): the heavy libraries every rank
imports anyway, so a rank forked from the server skips seconds of imports. Imports only: nothing here runs a
library's code or installs a shim (the Megatron harness's shims are installed by each rank, and checked to be
needed, in `tests/megatron_cpu`). A library this interpreter lacks, or one that fails to import, is skipped here;
a rank that needs it imports it, and fails, itself."""

from __future__ import annotations

import contextlib
import importlib
import warnings

HEAVY_MODULES = (
    "torch", "torch.distributed", "torch.multiprocessing", "numpy",
    "transformers", "transformers.models.deepseek_v3.modeling_deepseek_v3",
    "transformers.models.qwen3_moe.modeling_qwen3_moe",
    "megatron.core", "megatron.core.models.gpt", "megatron.core.models.gpt.gpt_layer_specs",
    "megatron.core.distributed", "megatron.core.optimizer", "megatron.core.pipeline_parallel",
    "megatron.core.dist_checkpointing", "megatron.core.transformer.module",
    "nemo_muon.optim", "nemo_muon.layerwise", "nemo_muon.train.loop",
)
"""Imported in this order when the server starts."""

with warnings.catch_warnings():  # the libraries' import-time warnings are the ranks' to show, not the server's
    warnings.simplefilter("ignore")
    for _name in HEAVY_MODULES:
        with contextlib.suppress(Exception):
            importlib.import_module(_name)
