"""Each harness shim is still needed (a training step without it fails as documented, at its call site) and the
set is still enough (a step with all of them runs and hits each documented call site), on the Megatron-Core this
interpreter has. A Megatron-Core bump that removes a need or adds one fails here."""

from __future__ import annotations

import importlib.metadata

import pytest

from tests.distributed import run_distributed
from tests.megatron_cpu import shims
from tests.megatron_cpu.training import train_tiny

MCORE = importlib.metadata.version("megatron-core")
SPEC = "tiny_kimi_k2"  # MLA + MoE with a shared expert and a dense layer: every shim's call site is on its path


@pytest.fixture(scope="module")
def with_all_shims() -> dict:
    return run_distributed(train_tiny, world_size=2, args=(SPEC, "adamw", 1), timeout_s=240)[0]


def test_all_shims_are_enough(with_all_shims):
    assert len(with_all_shims["losses"]) == 1


@pytest.mark.parametrize("name", sorted(shims.SHIMS))
def test_shim_is_hit_at_its_documented_call_sites_exactly_where_needed(name, with_all_shims):
    hit_files = set(with_all_shims["shim_hits"][name])
    if shims.needed_on(name, MCORE):
        missing = set(shims.SHIMS[name].call_sites) - hit_files
        assert not missing, f"{name} no longer hit at {missing} on megatron-core {MCORE} (hit: {sorted(hit_files)})"
    else:
        assert not hit_files, f"{name} is documented as not needed on megatron-core {MCORE} but was hit at {hit_files}"


@pytest.mark.parametrize("name", sorted(n for n in shims.SHIMS if shims.needed_on(n, MCORE)))
def test_shim_is_still_needed(name):
    with pytest.raises(RuntimeError, match=shims.SHIMS[name].failure):
        run_distributed(train_tiny, world_size=2, args=(SPEC, "adamw", 1, (name,)), timeout_s=240)
