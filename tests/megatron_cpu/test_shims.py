"""Each harness shim is still needed (a run without it fails as documented) and the set is still enough (a run
with all of them works and hits each documented call site), on the Megatron-Core this interpreter has. A
Megatron-Core bump that removes a need or adds one fails here. Checkpoint-only shims are checked on a Megatron
`dist_checkpointing` save + resume (torch Adam's common step on a layer-wise Muon save at DP=4), layer-wise-only ones
on a Muon step, DDP-wrap-only ones on Megatron's
``_ddp_wrap`` (Bridge's model setup)."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from tests.distributed import run_distributed
from tests.megatron_cpu import shims
from tests.megatron_cpu.training import train_tiny

MCORE = importlib.metadata.version("megatron-core")
SPEC = "tiny_kimi_k2"  # MLA + MoE with a shared expert and a dense layer: every shim's call site is on its path
NEEDED = sorted(n for n in shims.SHIMS if shims.needed_on(n, MCORE))


def _save(ckpt: Path, without: tuple[str, ...] = (), optimizer: str = "adamw", world_size: int = 2) -> dict:
    return run_distributed(train_tiny, world_size=world_size, args=(SPEC, optimizer, 1, without, str(ckpt), 1),
                           timeout_s=300, daemon=False)[0]


def _resume(ckpt: Path, without: tuple[str, ...] = (), optimizer: str = "adamw", world_size: int = 2) -> dict:
    return run_distributed(train_tiny, world_size=world_size, args=(SPEC, optimizer, 1, without, str(ckpt), None, 1),
                           timeout_s=300, daemon=False)[0]


MUON_AT_DP4 = {"optimizer": "muon", "world_size": 4}
"""A layer-wise Muon checkpoint on 4 ranks, where the NS-cost assignment leaves rank 0 no Adam parameter."""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ckpt = tmp_path_factory.mktemp("ckpt")
    return ckpt


def _ddp_wrap(without: tuple[str, ...] = ()) -> dict:
    from tests.megatron_cpu.bridge_layout_training import ddp_wrap_tiny

    return run_distributed(ddp_wrap_tiny, world_size=2, args=(without,), timeout_s=240)[0]


def _has_ddp_wrap() -> bool:
    """Megatron-Core ships ``megatron.training.models`` (0.18+; 0.16's wheel has no megatron.training, 0.17's one
    without ``models``)."""
    import importlib.util

    return importlib.util.find_spec("megatron.training") is not None and \
        importlib.util.find_spec("megatron.training.models") is not None


def _muon_step(without: tuple[str, ...] = ()) -> dict:
    return run_distributed(train_tiny, world_size=2, args=(SPEC, "muon", 1, without), timeout_s=240)[0]


@pytest.fixture(scope="module")
def hits_with_all_shims(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Shim -> Megatron files that hit it over an AdamW step + save, a resume + step, a layer-wise Muon step, and one
    with a save on 4 ranks, every shim installed, and (where Megatron-Core ships it) Megatron's DDP wrap that Bridge's
    model setup calls."""
    saved, resumed, muon = _save(checkpoint), _resume(checkpoint), _muon_step()
    dp4 = _save(tmp_path_factory.mktemp("dp4"), **MUON_AT_DP4)
    assert len(saved["losses"]) == len(resumed["losses"]) == len(muon["losses"]) == len(dp4["losses"]) == 1
    wrap = _ddp_wrap() if _has_ddp_wrap() else {"shim_hits": {n: [] for n in shims.SHIMS}}
    return {n: set(saved["shim_hits"][n]) | set(resumed["shim_hits"][n]) | set(muon["shim_hits"][n])
            | set(dp4["shim_hits"][n])
            | {f for f in wrap["shim_hits"][n] if n in shims.DDP_WRAP_ONLY} for n in shims.SHIMS}


@pytest.mark.parametrize("name", sorted(shims.SHIMS))
def test_shim_is_hit_at_its_documented_call_sites_exactly_where_needed(name, hits_with_all_shims):
    hit_files = hits_with_all_shims[name]
    if shims.needed_on(name, MCORE):
        missing = set(shims.SHIMS[name].call_sites) - hit_files
        assert not missing, f"{name} no longer hit at {missing} on megatron-core {MCORE} (hit: {sorted(hit_files)})"
    else:
        assert not hit_files, f"{name} is documented as not needed on megatron-core {MCORE} but was hit at {hit_files}"


@pytest.mark.parametrize("name", NEEDED)
def test_shim_is_still_needed(name, checkpoint, hits_with_all_shims, tmp_path):
    failure = shims.SHIMS[name].failure
    if name in shims.DDP_WRAP_ONLY:
        with pytest.raises(RuntimeError, match=failure):
            _ddp_wrap(without=(name,))
    elif name in shims.LAYER_WISE_ONLY:
        with pytest.raises(RuntimeError, match=failure):
            _muon_step(without=(name,))
    elif name not in shims.CHECKPOINT_ONLY:
        with pytest.raises(RuntimeError, match=failure):
            run_distributed(train_tiny, world_size=2, args=(SPEC, "adamw", 1, (name,)), timeout_s=240)
    elif name == "adam_common_step":  # saved without it at DP=4, the checkpoint does not load
        _save(tmp_path, without=(name,), **MUON_AT_DP4)
        with pytest.raises(RuntimeError, match=failure):
            _resume(tmp_path, without=(name,), **MUON_AT_DP4)
    elif name == "adam_step_for_load":  # reached when loading the checkpoint the fixture saved
        with pytest.raises(RuntimeError, match=failure):
            _resume(checkpoint, without=(name,))
    else:  # reached when saving
        with pytest.raises(RuntimeError, match=failure):
            _save(tmp_path, without=(name,))
