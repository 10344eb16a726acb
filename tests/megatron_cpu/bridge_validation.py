"""What Megatron-Bridge 0.3.0's config validation asks of the machine, answered for the recipe's target GPU.

`ConfigContainer.validate()` (run by `runtime_config_update`, the first thing Bridge's `pretrain()` does) reads the
GPU and the Transformer Engine install; on this CPU machine without TE, `target_machine(gpu)` answers those reads as
the recipe's target would, and nothing else:

* ``torch.cuda.get_device_properties(0)``: ``megatron/bridge/training/flex_dispatcher_backend.py:46,75``
  (HybridEP / DeepEP GPU gate of ``validate_flex_dispatcher_backend``) -> the target GPU's name and SM version;
* ``megatron.core.utils.get_te_version``: ``megatron/core/transformer/transformer_config.py`` version gates
  (fused MoE kernels, CUDA graphs, MXFP8) -> the container's TE version (`nemo_muon.versions`);
* TE's fused kernels that ``transformer_config.py`` only checks for existence: ``fused_permute`` & co. in
  ``megatron.core.transformer.moe.moe_utils`` (``moe_permute_fusion=True``) and ``fused_apply_rotary_pos_emb`` in
  ``megatron.core.models.common.embeddings.rope_utils`` (``apply_rope_fusion=True``, line 1549) -> placeholders
  that raise if ever called.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from unittest import mock

GpuProperties = namedtuple("GpuProperties", "name major minor total_memory multi_processor_count")
TARGET_GPUS: dict[str, GpuProperties] = {
    "gb300": GpuProperties("NVIDIA GB300", 10, 3, 288 * 2**30, 160),
    "gb200": GpuProperties("NVIDIA GB200", 10, 0, 192 * 2**30, 148),
    "b200": GpuProperties("NVIDIA B200", 10, 0, 180 * 2**30, 148),
    "h100": GpuProperties("NVIDIA H100 80GB HBM3", 9, 0, 80 * 2**30, 132),
}
FUSED_KERNELS: dict[str, tuple[str, ...]] = {
    "megatron.core.transformer.moe.moe_utils": ("fused_permute", "fused_permute_with_probs", "fused_unpermute",
                                                "fused_sort_chunks_by_index", "fused_sort_chunks_by_index_with_probs"),
    "megatron.core.models.common.embeddings.rope_utils": ("fused_apply_rotary_pos_emb",),
}


def _kernel_placeholder(name: str):
    def kernel(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{name} is a validation-only placeholder (tests/megatron_cpu/bridge_validation.py)")

    return kernel


@contextmanager
def target_machine(gpu: str, te_version: str) -> Iterator[None]:
    """Answer Bridge's validation-time machine queries as ``gpu`` with Transformer Engine ``te_version``."""
    import importlib

    from packaging.version import Version

    props = TARGET_GPUS[gpu]
    with ExitStack() as stack:
        stack.enter_context(mock.patch("torch.cuda.get_device_properties", lambda *a, **k: props))
        stack.enter_context(mock.patch("megatron.core.utils.get_te_version", lambda: Version(te_version)))
        # modules that imported get_te_version by name call the original, which returns this cached global
        stack.enter_context(mock.patch("megatron.core.utils._te_version", Version(te_version)))
        for module_name, kernels in FUSED_KERNELS.items():
            module = importlib.import_module(module_name)
            for name in kernels:
                if getattr(module, name, None) is None:
                    stack.enter_context(mock.patch.object(module, name, _kernel_placeholder(name), create=True))
        yield
