"""Packaging: every package folder is installed, .venv is where scripts expect it (dependency ranges and the lock:
tests/test_dependencies.py)."""

import tomllib
from pathlib import Path

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


def test_python_is_312_or_newer():
    assert _pyproject()["project"]["requires-python"] == ">=3.12"
