"""The megatron backend by generation (`nemo_muon.megatron.generations`, docs/ARCHITECTURE.md): a folder per
Megatron-Core / Megatron-Bridge generation, one table naming their entry points, and imports that let a generation be
deleted with its folder and its row.

Checked statically over every import (module level and lazy, as tests/test_layering.py reads them): a generation
folder imports what every generation shares and nothing of another generation, except a Bridge generation the
Megatron-Core generation it runs on; the shared folders import no generation; the table's entry points are functions
of the folder the row names; every version the table answers for is the one the container releases ship.
"""

from __future__ import annotations

import pytest

from nemo_muon.megatron.generations import (
    BRIDGE_GENERATIONS,
    CORE_GENERATIONS,
    bridge_generation,
    core_generation,
    entry,
)
from nemo_muon.versions import CONTAINER_RELEASES
from tests.test_layering import MODULES, _imports

PACKAGE = "nemo_muon.megatron"
SHARED = frozenset({"shared", "generations"})
FOLDER_IMPORTS: dict[str, frozenset[str]] = {
    "generations": frozenset(),  # names entry points as strings; imports none of them
    "shared": SHARED | {"bridge"},  # the recipe rules and the stack rules of the megatron backend ask Bridge's
    "bridge": SHARED | {"bridge"},
    "core_016_017": SHARED,
    "core_018_plus": SHARED,
    "bridge_03": SHARED | {"bridge"},
    "bridge_04_05": SHARED | {"bridge"},
    "bridge_04_plus": SHARED | {"bridge"},
    "bridge_05_06": SHARED | {"bridge", "core_018_plus"},  # Bridge 0.5 / 0.6 run on Megatron-Core >= 0.18 only
    "bridge_06": SHARED | {"bridge"},
    "nemo2": SHARED,  # NeMo 2.7 (NGC 26.02): the optimizer modules over the shared build
}
"""Folder (or top-level module) of nemo_muon/megatron -> the folders it may import besides its own."""
GENERATION_FOLDERS = {row.name for row in CORE_GENERATIONS} | {"bridge_03", "bridge_04_05", "bridge_04_plus",
                                                                 "bridge_05_06", "bridge_06"}


def _folder(module: str) -> str | None:
    """The folder (or top-level module) of nemo_muon/megatron a module is in; None outside it / the package doc."""
    if not module.startswith(PACKAGE + "."):
        return None
    return module[len(PACKAGE) + 1:].split(".")[0]


def _megatron_edges() -> list[tuple[str, str, int]]:
    return [(module, target, line) for module, path in MODULES.items() if _folder(module)
            for target, _, line in _imports(module, path) if _folder(target)]


def test_every_module_of_the_backend_is_in_a_folder_of_the_table():
    folders = {_folder(m) for m in MODULES if _folder(m)}
    assert folders == set(FOLDER_IMPORTS), f"give each folder a row in FOLDER_IMPORTS: {folders ^ set(FOLDER_IMPORTS)}"
    assert GENERATION_FOLDERS <= folders


def test_a_generation_imports_only_what_is_shared_and_the_core_it_runs_on():
    bad = [f"{module}:{line} imports {target}" for module, target, line in _megatron_edges()
           if _folder(target) != _folder(module) and _folder(target) not in FOLDER_IMPORTS[_folder(module)]]
    assert not bad, "imports across generations (tests/test_megatron_generations.py FOLDER_IMPORTS):\n" + "\n".join(bad)


@pytest.mark.parametrize("folder", sorted(GENERATION_FOLDERS))
def test_deleting_a_generation_is_its_folder_and_its_row(folder):
    """Outside the folder, only tests and the Bridge generations that run on it import it (the table names it)."""
    users = {m for m, target, _ in _megatron_edges() if _folder(target) == folder and _folder(m) != folder}
    allowed = {m for m in users if folder in FOLDER_IMPORTS[_folder(m)]}
    assert users == allowed
    outside = [f"{m} imports {t}" for m, path in MODULES.items() if not m.startswith(PACKAGE)
               for t, _, _ in _imports(m, path) if _folder(t) == folder]
    assert not outside, outside


def test_every_entry_point_of_the_table_is_a_function_of_its_folder():
    references = [(row.name, ref) for row in CORE_GENERATIONS
                  for ref in (row.build_engine, row.wrap_with_cost_layout) if ref is not None]
    for row in BRIDGE_GENERATIONS:
        references += [(None, ref) for ref in (row.base_container, row.install_engine, row.engine_optimizer_config,
                                               row.cost_layout) if ref is not None]
    for folder, reference in references:
        module, _, name = reference.partition(":")
        assert module in MODULES and _folder(module) in GENERATION_FOLDERS, reference
        assert folder is None or _folder(module) == folder, reference
        source = MODULES[module].read_text()
        assert f"\ndef {name}(" in source, reference  # resolved without importing Megatron


def test_every_container_release_has_its_generations():
    for release in CONTAINER_RELEASES.values():
        core_generation(release.megatron_core)
        bridge_generation(release.megatron_bridge)


@pytest.mark.parametrize("version, folder", [("0.16.0", "core_016_017"), ("0.17.1", "core_016_017"),
                                             ("0.18.2", "core_018_plus"), ("0.19.2", "core_018_plus"),
                                             ("0.20.0rc1", "core_018_plus")])
def test_a_megatron_core_version_finds_its_folder(version, folder):
    assert core_generation(version).name == folder


def test_an_unsupported_version_is_refused_naming_what_is_supported():
    with pytest.raises(ValueError, match=r"megatron-core must be >= 0.16 \(the first with Muon\); got '0.15.3'"):
        core_generation("0.15.3")
    with pytest.raises(ValueError, match=r"megatron-bridge must be one of 0.3, 0.4, 0.5, 0.6 .*; got '0.2.1'"):
        bridge_generation("0.2.1")


def test_a_newer_bridge_gets_the_public_extension_point_and_no_pinned_hook():
    newer = bridge_generation("0.7.0")
    assert newer.engine_entry == "provide" and newer.cost_layout is None and newer.minor == (0, 7)
    assert bridge_generation("0.6.2").cost_layout is not None


def test_entry_imports_the_named_function():
    assert entry("nemo_muon.megatron.generations:core_generation") is core_generation
