"""The private names of Megatron-Core the engine writes into are pinned (docs/megatron_cpu.md, "Every runtime change"):
where the installed generation uses them they are where 0.18 / 0.19 have them, and a Megatron-Core that moves them is
refused naming the installed version, before anything is registered."""

from __future__ import annotations

import importlib.metadata
import types

import pytest

from nemo_muon.megatron.core_018_plus.registry_entry import register_with_megatron, registry_problems
from nemo_muon.megatron.generations import installed_core_generation

MCORE = importlib.metadata.version("megatron-core")


def test_the_emerging_optimizer_table_is_where_the_registry_generation_expects_it():
    if installed_core_generation().name == "core_018_plus":
        assert registry_problems() == []
        register_with_megatron()
        from megatron.core.optimizer import emerging_optimizers

        assert {"nemo_muon.muon", "nemo_muon.soap", "nemo_muon.normuon", "nemo_muon.adamuon"} <= set(
            emerging_optimizers._EMERGING_OPTIMIZERS)
    else:  # 0.16 / 0.17 have no table: their generation assembles the optimizer instead (core_016_017)
        assert registry_problems()


def test_a_megatron_core_that_moved_the_table_is_refused_naming_its_version():
    moved = types.ModuleType("emerging_optimizers")
    with pytest.raises(RuntimeError, match=rf"installed megatron-core {MCORE} lacks: _EMERGING_OPTIMIZERS .*; "
                                           r"EmergingOptimizerEntry with fields"):
        register_with_megatron(moved)
    moved._EMERGING_OPTIMIZERS = {}

    class EmergingOptimizerEntry:  # no longer the dataclass with our three fields
        pass

    moved.EmergingOptimizerEntry = EmergingOptimizerEntry
    with pytest.raises(RuntimeError, match=r"lacks: EmergingOptimizerEntry with fields \('optimizer_cls', "
                                           r"'init_state_fn', 'config_to_kwargs'\)"):
        register_with_megatron(moved)
    assert moved._EMERGING_OPTIMIZERS == {}  # nothing half-registered
