"""docs/ARCHITECTURE.md stays the complete map of the code (pure file reading, no imports of the package).

- every module file under nemo_muon/, recipes/ and launchers/ is named in it by its repo-relative path;
- every ``.py`` path it names exists (paths are written repo-relative: ``nemo_muon/layerwise/ownership.py``);
- its layer table ("What each component may import") is `ALLOWED` of tests/test_layering.py, row for row, and it
  names every `EXEMPT` entry-point call.
"""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_layering import ALLOWED, EXEMPT

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
SOURCE_DIRS = ("nemo_muon", "recipes", "launchers")
PY_PATH = re.compile(r"(?<![\w./-])[\w./-]+\.py\b")
TABLE_HEAD = "| component | may import |"


def _text() -> str:
    return DOC.read_text(encoding="utf-8")


def _module_files() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for d in SOURCE_DIRS for p in (ROOT / d).rglob("*.py")}


def _named_paths(text: str) -> set[str]:
    return set(PY_PATH.findall(text))


def _layer_table(text: str) -> dict[str, frozenset[str]]:
    """component -> what it may import, from the doc's layer table (``*`` = anything; "nothing" = empty)."""
    lines = text.splitlines()
    start = lines.index(TABLE_HEAD) + 2  # past the header and its |---| line
    table: dict[str, frozenset[str]] = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        component = re.findall(r"`([^`]+)`", cells[0])[0]
        assert component not in table, f"docs/ARCHITECTURE.md: layer table row {component!r} appears twice"
        table[component] = frozenset(re.findall(r"`([^`]+)`", cells[1]))
    return table


def test_the_walk_finds_the_package() -> None:
    files = _module_files()
    assert len(files) > 80 and "nemo_muon/layerwise/ownership.py" in files and "recipes/execute.py" in files


def test_every_module_file_is_named() -> None:
    missing = sorted(_module_files() - _named_paths(_text()))
    assert not missing, f"docs/ARCHITECTURE.md does not name these module files (add a row): {missing}"


def test_every_named_py_path_exists() -> None:
    stale = sorted(p for p in _named_paths(_text()) if not (ROOT / p).is_file())
    assert not stale, f"docs/ARCHITECTURE.md names .py paths that do not exist (write repo-relative paths): {stale}"


def test_the_layer_table_is_the_enforced_one() -> None:
    assert _layer_table(_text()) == ALLOWED, (
        "docs/ARCHITECTURE.md's layer table differs from tests/test_layering.py ALLOWED")


def test_every_exemption_is_named() -> None:
    text = _text()
    for module, function, target in EXEMPT:
        for name in (f"{module}.{function}", target):
            assert f"`{name}`" in text, f"docs/ARCHITECTURE.md does not name the exemption's `{name}`"


def test_the_table_reader_fails_on_a_missing_row() -> None:
    """The layer-table check can fail: the doc with one row removed no longer equals ALLOWED."""
    text = _text()
    row = next(line for line in text.splitlines() if line.startswith("| `optim` |"))
    assert _layer_table(text.replace(row + "\n", "")) != ALLOWED
