"""Which Newton–Schulz matrices may use emerging-optimizers' Triton SYRK kernel: checked on the CPU with a faked GPU."""

from __future__ import annotations

import sys
import types

import pytest
import torch

from nemo_muon.optim import ns_kernels


@pytest.mark.parametrize(("shape", "picked"), [((1024, 4096), True), ((1020, 4096), False), ((1024, 4100), False),
                                               ((7, 8), False), ((8, 8), True), ((4, 64, 64), False)])
def test_syrk_is_chosen_only_for_shapes_its_kernel_takes(monkeypatch, shape, picked) -> None:
    """The SYRK selection on a (faked) H200 with triton >= 3.4: emerging-optimizers' tsyrk_ex needs both dimensions
    to be multiples of 8 (TMA descriptors: 16-byte strides in bf16); any other shape falls back to GEMMs."""
    kernel = object()
    fake = types.ModuleType("emerging_optimizers.triton_kernels")
    fake.HAS_TRITON_340, fake.tsyrk_ex = True, kernel
    monkeypatch.setitem(sys.modules, "emerging_optimizers.triton_kernels", fake)
    monkeypatch.setattr(sys.modules["emerging_optimizers"], "triton_kernels", fake, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    x = types.SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16, shape=torch.Size(shape),
                              ndim=len(shape))
    assert (ns_kernels.syrk_kernel(x) is kernel) is picked
    reason = ns_kernels.syrk_refusal(shape, capability=(9, 0), has_triton_340=True)
    assert (reason is None) is picked
    if len(shape) == 2 and not picked:
        assert "multiple of 8" in reason
    assert ns_kernels.syrk_refusal((1024, 4096), capability=(7, 5), has_triton_340=True).startswith("GPU capability")
    assert ns_kernels.syrk_refusal((1024, 4096), capability=(9, 0), has_triton_340=False) == "triton < 3.4"
