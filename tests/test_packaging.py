"""Packaging: every package folder is listed, the installed distribution is the one pyproject declares (dependency
ranges and the lock: tests/test_dependencies.py)."""

import importlib
import platform
import tomllib
from importlib import metadata
from pathlib import Path

import click
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_listed():
    cfg = _pyproject()["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapping = cfg["package-dir"]
    found = set()
    for import_root, folder in mapping.items():
        base = ROOT / folder
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base)
            found.add(".".join((import_root, *rel.parts)))
    assert found == listed, f"pyproject packages differ from package folders: missing {found - listed}, extra {listed - found}"


def test_the_installed_distribution_is_what_pyproject_declares():
    """The installed nemo-muon (``pip install -e .`` in .venv) carries pyproject's Python range and scripts, runs on
    this interpreter, and every declared package imports from the folder package-dir maps it to."""
    project = _pyproject()["project"]
    dist = metadata.distribution(project["name"])
    stale = "the installed metadata differs from pyproject.toml: run `.venv/bin/pip install -e .` again"
    assert dist.metadata["Requires-Python"] == project["requires-python"], stale
    assert SpecifierSet(project["requires-python"]).contains(platform.python_version()), platform.python_version()
    scripts = {e.name: e.value for e in dist.entry_points if e.group == "console_scripts"}
    assert scripts == project["scripts"], stale
    for name in scripts:
        assert isinstance(dist.entry_points.select(group="console_scripts", name=name)[name].load(), click.Command)
    cfg = _pyproject()["tool"]["setuptools"]
    for package in cfg["packages"]:
        root = max((r for r in cfg["package-dir"] if package == r or package.startswith(r + ".")), key=len)
        folder = ROOT / cfg["package-dir"][root] / Path(*package[len(root):].split(".")[1:])
        assert Path(importlib.import_module(package).__file__) == folder / "__init__.py", package


def test_ruff_targets_the_oldest_python_pyproject_allows():
    """Lint rules (pyupgrade's UP) follow target-version: it must be the lowest version requires-python admits."""
    cfg = _pyproject()
    lowest = next(v for v in (f"3.{m}" for m in range(8, 30)) if SpecifierSet(cfg["project"]["requires-python"])
                  .contains(v))
    assert cfg["tool"]["ruff"]["target-version"] == "py" + lowest.replace(".", "")


def test_a_built_wheel_carries_the_hugging_face_config_of_every_megatron_model(tmp_path):
    """Megatron-Bridge builds each megatron model from its config.json, which nemo-muon ships as package data
    (pyproject's [tool.setuptools.package-data]): a wheel without it would leave every megatron recipe without a
    config to read offline. Built from a copy of the sources (nothing written into the checkout)."""
    import shutil
    import subprocess
    import sys
    import zipfile

    from nemo_muon.megatron.bridge.hf_config import HF_MODEL_IDS

    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    for folder in _pyproject()["tool"]["setuptools"]["package-dir"].values():
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(tmp_path / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("nemo_muon-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"nemo_muon/models/hf_configs/{model}/config.json" for model in HF_MODEL_IDS} <= names
