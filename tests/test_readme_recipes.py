"""README.md's recipe table states exactly the registered recipes, each under the optimizer it builds."""

from __future__ import annotations

import re
from pathlib import Path

from nemo_muon.recipes import get_recipe, list_recipes

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_recipes() -> dict[str, str]:
    """Recipe name -> optimizer column, from the table between ``<!-- recipes`` and ``<!-- /recipes -->``."""
    text = README.read_text(encoding="utf-8")
    block = text[text.index("<!-- recipes"):text.index("<!-- /recipes -->")]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in block.splitlines()
            if line.startswith("|")]
    header, body = rows[0], rows[2:]
    assert header[0] == "Model" and len(body) > 0, header
    out: dict[str, str] = {}
    for row in body:
        model = row[0].strip("`")
        for column, cell in zip(header[1:], row[1:], strict=True):
            for suffix in re.findall(r"`(_[a-z0-9_]+)`", cell):
                assert f"{model}{suffix}" not in out, suffix
                out[f"{model}{suffix}"] = column.lower()
            assert cell == "none" or re.fullmatch(r"`_[a-z0-9_]+`(, `_[a-z0-9_]+`)*", cell), cell
    return out


def test_readme_names_exactly_the_registered_recipes() -> None:
    claimed = readme_recipes()
    assert sorted(claimed) == list_recipes()
    for name, column in claimed.items():
        assert get_recipe(name).optimizer.name == column, name

