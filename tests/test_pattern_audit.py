"""Every regular expression of the product, audited statically (issue 35: the class, not the examples).

Two traps the red team used, each accepted input that was wrong:

- ``\\d``, ``\\w``, ``\\s`` and ``\\b`` are Unicode in Python's ``re``: ``\\d`` matches Arabic-Indic digits, which
  ``int()`` then reads, so ``#SBATCH --time=٠١:٠٠:٠٠`` passed. A pattern using them must be compiled with
  ``re.ASCII`` (or ``(?a)``).
- ``$`` matches before a trailing newline, so ``ENV_NAME.match("FOO\\n")`` passed and split an ``export`` line.
  A pattern ends with ``\\Z`` or is used with ``fullmatch``; no pattern of the product contains ``$``.

Patterns are found in every ``re.<function>(pattern, ...)`` call of nemo_muon/, recipes/ and launchers/, with the
pattern a literal, a module-level string constant or a ``+`` of them (a part built by a call, such as
``"|".join(map(re.escape, names))``, is skipped and its literal neighbours audited); a pattern built otherwise
fails the audit (make it a constant). ``EXEMPT`` lists the patterns of files this audit does not own, each with its reason.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = (ROOT / "nemo_muon", ROOT / "recipes", ROOT / "launchers")
RE_FUNCTIONS = {"compile": 1, "match": 2, "search": 2, "fullmatch": 2, "sub": 4, "subn": 4, "split": 3,
                "findall": 2, "finditer": 2}
"""re function -> position of its ``flags`` argument."""
UNICODE_CLASSES = re.compile(r"(?<!\\)(?:\\\\)*\\[dwsbDWSB]")
DOLLAR = re.compile(r"(?<!\\)(?:\\\\)*\$")
EXEMPT: dict[str, str] = {
    "nemo_muon/versions.py":
        "parses the pinned version table written in this repository and installed packages' version strings, "
        "not user input; owned outside this change (its `\\d` and `$` are listed in the issue 35 report)",
}


def _files() -> Iterator[Path]:
    for root in SOURCES:
        yield from sorted(root.rglob("*.py"))


def _constants(tree: ast.Module) -> dict[str, ast.AST]:
    """Module-level ``NAME = <expression>`` assignments."""
    out: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = node.value
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            out[node.target.id] = node.value
    return out


def _text(node: ast.AST, constants: dict[str, ast.AST], depth: int = 0) -> str | None:
    """The pattern text a node spells: literals, f-string literal parts, names of constants, ``+`` of those."""
    if depth > 20:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "" for v in node.values)
    if isinstance(node, ast.Name) and node.id in constants:
        return _text(constants[node.id], constants, depth + 1)
    if isinstance(node, ast.Call) and depth:  # a part built by a call ("|".join(map(re.escape, names))): its
        return ""  # literal neighbours are audited
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left, constants, depth + 1), _text(node.right, constants, depth + 1)
        return None if left is None or right is None else left + right
    return None


def _ascii(flags: ast.AST | None, constants: dict[str, ast.AST]) -> bool:
    if flags is None:
        return False
    if isinstance(flags, ast.Name) and flags.id in constants:
        return _ascii(constants[flags.id], constants)
    return any(isinstance(n, ast.Attribute) and n.attr in ("ASCII", "A") for n in ast.walk(flags))


def _patterns() -> Iterator[tuple[str, int, str | None, bool]]:
    """(file, line, pattern text or None when it cannot be read statically, compiled ASCII) per re call."""
    for path in _files():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = _constants(tree)
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
                    and node.func.attr in RE_FUNCTIONS and node.args):
                continue
            position = RE_FUNCTIONS[node.func.attr]
            flags = next((kw.value for kw in node.keywords if kw.arg == "flags"), None)
            if flags is None and len(node.args) > position:
                flags = node.args[position]
            yield rel, node.lineno, _text(node.args[0], constants), _ascii(flags, constants)


AUDITED = [p for p in _patterns() if p[0] not in EXEMPT]


def test_the_audit_sees_the_patterns_it_must() -> None:
    files = {p[0] for p in AUDITED}
    assert {"nemo_muon/config/limits.py", "launchers/slurm.py", "nemo_muon/reporting/megatron_log.py",
            "nemo_muon/secret_policy.py", "nemo_muon/megatron/shared/checkpoint_files.py"} <= files
    assert len(AUDITED) > 40


@pytest.mark.parametrize(("where", "line", "pattern", "ascii_flag"), AUDITED,
                         ids=[f"{p[0]}:{p[1]}" for p in AUDITED])
def test_every_pattern_is_ascii_and_end_anchored_with_backslash_z(where: str, line: int, pattern: str | None,
                                                                  ascii_flag: bool) -> None:
    assert pattern is not None, f"{where}:{line}: make the pattern a literal or a module-level constant"
    assert not DOLLAR.search(pattern), f"{where}:{line}: {pattern!r} uses $ (a trailing newline passes): use \\Z"
    if UNICODE_CLASSES.search(pattern):
        assert ascii_flag or "(?a" in pattern, f"{where}:{line}: {pattern!r} needs re.ASCII (\\d takes any digit)"
