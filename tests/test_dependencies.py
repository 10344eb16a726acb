"""Declared dependencies: pyproject's ranges hold both environments' exact versions and the versions table's pins,
and every third-party import of the package is declared (extras imported only where they are needed).

Ranges are in pyproject.toml; the CPU dev environment's exact versions in requirements/cpu-dev.txt (the Makefile
installs ``-c`` it); NGC 26.02's stack in requirements/container-stack-26.02.txt; the container releases in
nemo_muon/versions.py. tests/container_stack/test_install_beside_container.py runs pip against the real stack.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from nemo_muon.versions import BASE_OWNED_DISTRIBUTIONS, CONTAINER_RELEASES, CONTAINER_STACK_LOCK, DEFAULT_RELEASE

ROOT = Path(__file__).resolve().parents[1]
CPU_LOCK = ROOT / "requirements" / "cpu-dev.txt"
# Sections installed only where the container is absent (the test tools); the container-stack checks leave them out.
DEV_EXTRAS = ("dev",)
# Sections pinned exactly to the default release (what a CPU cannot import; the container's own builds).
PINNED_EXTRAS = ("gpu",)
# Imports declared nowhere: NeMo toolkit comes only with NeMo's container (nemo_muon.megatron.nemo2 imports it
# lazily and names it in its ImportError).
UNDECLARED_IMPORTS = {"nemo": "nemo-toolkit"}
# Imports in namespaces shared by several distributions (resolved on their first two components).
NAMESPACE_IMPORTS = {"megatron.core": "megatron-core", "megatron.bridge": "megatron-bridge"}
# The modules that may import an extra's packages at module level; anywhere else they are imported lazily, so that
# `import nemo_muon`, the optimizers and the `nemo-muon` CLI need only the core dependencies.
EXTRA_HOMES = {
    "train": ("nemo_muon/train/",),
    # nemo2.py needs NeMo 2.7, which brings NeMo-Run; it is loaded only on demand (nemo_muon.megatron.__getattr__)
    "nemo-run": ("recipes/nemo_run_registration.py", "nemo_muon/megatron/nemo2.py"),
    # Bridge >= 0.4's extension point subclasses Bridge's OptimizerConfig; loaded only where Bridge is installed
    # (nemo_muon.megatron.bridge.container.bridge_optimizer_config imports it lazily)
    "gpu": ("nemo_muon/megatron/bridge_04_plus/provider.py",),
}
SOURCE_DIRS = ("nemo_muon", "recipes", "launchers")


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _sections() -> dict[str, dict[str, Requirement]]:
    """"core" and each extra -> normalized name -> requirement."""
    project = _project()
    raw = {"core": project["dependencies"], **project["optional-dependencies"]}
    return {sec: {canonicalize_name(r.name): r for r in map(Requirement, reqs)} for sec, reqs in raw.items()}


def _ranges(*, exclude: tuple[str, ...] = ()) -> dict[str, Requirement]:
    """Normalized name -> requirement across sections; a name declared twice must be declared identically."""
    out: dict[str, Requirement] = {}
    for sec, reqs in _sections().items():
        if sec in exclude:
            continue
        for name, req in reqs.items():
            assert name not in out or str(out[name].specifier) == str(req.specifier), f"{name} declared twice"
            out[name] = req
    return out


def _lock(path: Path) -> dict[str, str]:
    """Normalized name -> version of an exact ``name==version`` lock; any other line fails the test."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        assert m, f"{path.name}: not an exact pin: {line!r}"
        pins[canonicalize_name(m.group(1))] = m.group(2)
    return pins


def _makefile_extras() -> list[str]:
    m = re.search(r"^EXTRAS := (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert m, "Makefile: no 'EXTRAS := ...' line"
    return m.group(1).split(",")


def _admits(req: Requirement, version: str) -> bool:
    return req.specifier.contains(version, prereleases=True)


def test_every_requirement_has_an_upper_bound():
    """Ranges, not open ends: a new major/minor release is adopted by testing it and moving the bound."""
    for sec, reqs in _sections().items():
        for name, req in reqs.items():
            ops = {s.operator for s in req.specifier}
            assert ops & {"<", "<=", "==", "~="}, f"[{sec}] {name}: no upper bound in {req}"
            assert req.marker is None, f"[{sec}] {req}: markers are not checked by these tests"


def test_ranges_admit_the_container_stack():
    """Every distribution of NGC 26.02's stack that we declare satisfies our range: pip keeps the container's."""
    stack = _lock(ROOT / CONTAINER_STACK_LOCK)
    ranges = _ranges(exclude=DEV_EXTRAS)
    both = sorted(set(stack) & set(ranges))
    assert {"torch", "numpy", "transformers", "megatron-core", "nemo-run", "emerging-optimizers"} <= set(both)
    bad = {n: (stack[n], str(ranges[n].specifier)) for n in both if not _admits(ranges[n], stack[n])}
    assert bad == {}, f"container-stack versions outside pyproject's ranges (version, range): {bad}"


def _installed_closure(root: str) -> set[str]:
    """``root`` and every distribution it requires here, transitively (markers evaluated for this machine)."""
    seen, todo = set(), [canonicalize_name(root)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in importlib.metadata.requires(name) or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def test_both_environments_pin_the_same_torch_cuda_stack():
    """The Makefile installs both environments hard-linked from one uv cache, so what the locks pin alike lies on disk
    once. torch's CUDA build and what it pulls in are about 7 GB of the 9 GB both take: a different torch or nvidia-*
    library in .venv than in the container stack would put a second one on CI's small disk (the container-stack
    install ran out of space that way)."""
    cpu, stack = _lock(CPU_LOCK), _lock(ROOT / CONTAINER_STACK_LOCK)
    cuda_stack = {n for n in _installed_closure("torch") if n.startswith(("torch", "triton", "nvidia-", "cuda-"))}
    assert {"torch", "triton", "nvidia-cudnn-cu12", "nvidia-nccl-cu12", "cuda-bindings"} <= cuda_stack
    differ = {n: (cpu.get(n), stack.get(n)) for n in sorted(cuda_stack) if cpu.get(n) != stack.get(n)}
    assert differ == {}, f"torch's CUDA stack (requirements/cpu-dev.txt, container stack): {differ}"


def test_cpu_lock_pins_every_direct_dependency_inside_its_range():
    lock = _lock(CPU_LOCK)
    assert canonicalize_name("nemo-muon") not in lock, "the lock pins dependencies, not nemo-muon itself"
    sections = _sections()
    extras = _makefile_extras()
    assert set(extras) <= set(sections), f"Makefile EXTRAS {extras} vs pyproject's {sorted(sections)}"
    for sec in ("core", *extras):
        for name, req in sections[sec].items():
            assert name in lock, f"[{sec}] {name}: not in {CPU_LOCK.name}"
            assert _admits(req, lock[name]), f"[{sec}] {name}=={lock[name]} ({CPU_LOCK.name}) outside {req}"


def test_release_extras_satisfy_the_ranges():
    """The pins the image adds where the base lacks them (nemo_muon.versions) are inside our ranges."""
    ranges = _ranges(exclude=DEV_EXTRAS)
    for rel in CONTAINER_RELEASES.values():
        pins = rel.extra_pins()
        assert "emerging-optimizers" in pins, rel.tag
        for name, version in pins.items():
            if name in ranges:
                assert _admits(ranges[name], version), f"{rel.tag}: {name}=={version} outside {ranges[name]}"


@pytest.mark.parametrize("tag", list(CONTAINER_RELEASES))
def test_base_owned_versions_satisfy_the_ranges(tag):
    """Each release's documented torch / Megatron-Core / NeMo-Run is in our range, also as NGC's own build reports it
    (a pre-release such as 2.10.0a0+git or 0.16.0rc0): a range excluding it would make pip replace the base's."""
    rel = CONTAINER_RELEASES[tag]
    ranges = _ranges(exclude=DEV_EXTRAS + PINNED_EXTRAS)
    documented = {n: v for n, v in rel.expected_distributions().items() if n in ranges}
    assert {"megatron-core", "nemo-run"} <= set(documented)  # torch: where documented (26.02, 26.02.01)
    for name, version in documented.items():
        assert name in BASE_OWNED_DISTRIBUTIONS
        for build in (version, f"{version}a0+ngc", f"{version}rc0"):
            assert _admits(ranges[name], build), f"{tag}: {name} {build} outside {ranges[name]}"


def test_pinned_extras_match_the_default_release():
    rel = CONTAINER_RELEASES[DEFAULT_RELEASE]
    documented = rel.expected_distributions()
    for sec in PINNED_EXTRAS:
        for name, req in _sections()[sec].items():
            assert name in documented, f"[{sec}] {name} is not in the {rel.tag} table"
            assert _admits(req, documented[name]), f"[{sec}] {req} vs {rel.tag}'s {name} {documented[name]}"


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(absolute module name, imported at module level) of a source file; ``if TYPE_CHECKING:`` blocks are skipped."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.Import):
                out.extend((a.name, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                out.append((child.module, top))
            nested = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            visit(child, top and not nested)

    visit(tree, True)
    return out


def _distribution_of(module: str, known: dict[str, list[str]]) -> str | None:
    """The distribution an import needs; None for the standard library and our own package."""
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top in ("nemo_muon", "recipes", "launchers"):
        return None
    if (ns := ".".join(module.split(".")[:2])) in NAMESPACE_IMPORTS:
        return NAMESPACE_IMPORTS[ns]
    if top in UNDECLARED_IMPORTS:
        return UNDECLARED_IMPORTS[top]
    assert top in known, f"import {module}: no installed distribution provides {top!r}"
    return canonicalize_name(known[top][0])


def test_every_third_party_import_is_declared_and_extras_are_imported_lazily():
    known = importlib.metadata.packages_distributions()
    sections = _sections()
    owner = {name: sec for sec, reqs in sections.items() if sec not in DEV_EXTRAS for name in reqs}
    undeclared, eager = [], []
    for folder in SOURCE_DIRS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for module, top in _imports(path):
                dist = _distribution_of(module, known)
                if dist is None or dist in UNDECLARED_IMPORTS.values():
                    continue
                sec = owner.get(dist)
                if sec is None:
                    undeclared.append(f"{rel}: {module} ({dist})")
                elif top and sec != "core" and not rel.startswith(EXTRA_HOMES.get(sec, ())):
                    eager.append(f"{rel}: {module} (extra [{sec}]) at module level")
    assert undeclared == [], f"imports of undeclared distributions: {undeclared}"
    assert eager == [], f"extras imported at module level outside {EXTRA_HOMES}: {eager}"

