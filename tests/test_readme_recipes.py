"""README.md's recipe table states exactly the registered recipes, each under the optimizer it builds; the sentence
above it (which suffixes have no SOAP) and the list of `nemo-muon` commands hold too."""

from __future__ import annotations

import re
from pathlib import Path

from nemo_muon.launchers.cli import main as nemo_muon_cli
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



NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}


def test_readme_says_which_recipes_have_soap() -> None:
    """'Every model has Muon and AdamW; SOAP exists for <n> models, on the default GPU and precision only; the other
    GPUs and precisions (<suffixes>) are Muon and AdamW only', checked against the registry."""
    text = README.read_text(encoding="utf-8")
    m = re.search(r"Every model has Muon and AdamW; SOAP exists for (\w+) models, on the default GPU and\s+precision "
                  r"only; the other GPUs and precisions \(([^)]*)\) are Muon and AdamW only", text)
    assert m, "README's sentence about SOAP changed: update this test with it"
    models = {r.model.name for r in map(get_recipe, list_recipes())}
    assert all(f"{model}_{opt}" in list_recipes() for model in models for opt in ("muon", "adamw"))
    soap = [get_recipe(n) for n in list_recipes() if get_recipe(n).optimizer.name == "soap"]
    assert NUMBERS[m.group(1)] == len({r.model.name for r in soap})
    variants = {suffix for n in list_recipes() for suffix in re.findall(r"_(b200|gb200|h100|h200|bf16|fp8_cs)$", n)}
    assert set(re.findall(r"`_([a-z0-9_]+)`", m.group(2))) == variants  # every GPU / precision variant is named
    assert not [r.name for r in soap if r.name != f"{r.model.name}_soap"]


def test_readme_lists_every_nemo_muon_command() -> None:
    text = README.read_text(encoding="utf-8")
    line = re.search(r"the `nemo-muon` CLI for operators: (.*?) \(Slurm", text, re.S)
    assert line, "README's launchers/ line changed: update this test with it"
    assert set(re.findall(r"`([a-z]+)`", line.group(1))) == set(nemo_muon_cli.commands)
