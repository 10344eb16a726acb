"""The layers of the package, enforced statically (docs/ARCHITECTURE.md, "Layers").

Every ``import`` / ``from ... import`` in every .py file of nemo_muon/, recipes/ (``nemo_muon.recipes``) and
launchers/ (``nemo_muon.launchers``) is an edge, wherever it is written: at module level, under ``TYPE_CHECKING``,
or lazily inside a function. ``importlib.import_module("<literal>")`` counts too. Two rules:

- no import cycle between modules;
- an edge between two components (``nemo_muon.<first name>``) goes only where ``ALLOWED`` says.

``EXEMPT`` lists the lazy entry-point calls allowed to go against the table, each with its reason; nothing else is.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES: dict[str, Path] = {
    "nemo_muon": ROOT / "nemo_muon",
    "nemo_muon.recipes": ROOT / "recipes",
    "nemo_muon.launchers": ROOT / "launchers",
}

_BASE = frozenset({"_validation"})
ALLOWED: dict[str, frozenset[str]] = {
    # bottom: helpers, data and torch-free cost models
    "_validation": frozenset(),
    "secret_policy": frozenset(),
    "rank_env": frozenset(),
    "versions": _BASE,
    "models": _BASE,
    "config": _BASE | {"models"},
    # the optimizer registry: which optimizer a config is, and the one cost model of a matrix update
    "registry": _BASE | {"config"},
    "accounting": _BASE | {"config", "models", "registry"},
    # the optimizers and the whole-tensor optimizer
    "optim": _BASE | {"config", "models", "accounting", "registry"},
    "layerwise": _BASE | {"config", "models", "accounting", "optim", "registry"},
    "reporting": _BASE | {"config", "models", "accounting", "registry"},
    # the two training backends, side by side (neither imports the other)
    "megatron": _BASE | {"config", "models", "accounting", "optim", "layerwise", "versions", "registry"},
    "train": _BASE | {"config", "models", "accounting", "optim", "layerwise", "reporting", "registry"},
    # the one validation of a run, then the recipes: config types, the registry, the backends' entry points
    "run_checks": _BASE | {"config", "models", "accounting", "registry", "megatron.shared.recipe_rules",
                           "train.recipe_rules"},
    "recipes": _BASE | {
        "config", "models", "secret_policy", "run_checks", "registry",
        "accounting.layout",  # the layout every recipe is validated against
        "accounting.ns_split",  # the split target a recipe ships (DEFAULT_BALANCE_TARGET)
        "megatron.bridge.perf_presets", "megatron.shared.optimizer_config",  # Bridge's presets, Megatron's Muon defaults
        "megatron.shared.fallback_warnings",  # the NeMo-Run entry point: Megatron's absent-TE warnings as one line
        "megatron.bridge.container", "megatron.nemo2", "train.pretrain",  # the backends' entry points (called lazily)
        "train.refusals",  # a rank's refusal printed once (nemo_run_task, what NeMo-Run's ranks call)
    },
    # a recipe's optimizer path proven on the allocation: the recipes, the Megatron backend it drives
    "preflight": _BASE | {"config", "models", "registry", "recipes", "megatron", "optim", "train.refusals",
                          "rank_env"},
    # top: the CLI, and the package facade (its lazy attribute table)
    "launchers": frozenset({"*"}),
    "nemo_muon": frozenset({"*"}),
}
"""Component -> what it may import: a component, or ``component.module`` (``component.folder.module``) for that one
module only; ``*`` = any."""

EXEMPT: dict[tuple[str, str, str], str] = {
    ("nemo_muon.train.pretrain", "main", "nemo_muon.recipes.execute"):
        "`python -m nemo_muon.train.pretrain <recipe>` resolves the recipe name once and runs it through the one "
        "launch path (recipes.execute.run_resolved)",
    ("nemo_muon.train.demo", "demo_recipes", "nemo_muon.recipes.execute"):
        "`python -m nemo_muon.train.demo` (make demo) resolves the tiny recipes once (build_recipe, check_run)",
}
"""(module, function, imported module) -> why a lazy entry-point call may go up."""


def _module_name(prefix: str, root: Path, path: Path) -> str:
    parts = [prefix, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for prefix, root in SOURCES.items():
        for path in sorted(root.rglob("*.py")):
            out[_module_name(prefix, root, path)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The module of ours that ``name`` (a module or a name inside one) is, or None for third-party imports."""
    head = name.split(".")[0]
    if head in ("recipes", "launchers"):  # the source folders' own names, as in `python -m launchers.cli`
        name = f"nemo_muon.{name}"
    elif head != "nemo_muon":
        return None
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> Iterator[tuple[str, str, int]]:
    """(imported module, enclosing function or '', line) of every import in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST, function: str) -> Iterator[tuple[str, str, int]]:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) and not function \
                else function
            names: list[str] = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [f"{base}.{a.name}" if _resolve(f"{base}.{a.name}") == f"{base}.{a.name}" else base
                         for a in child.names]
            elif (isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute)
                  and child.func.attr == "import_module" and child.args
                  and isinstance(child.args[0], ast.Constant) and isinstance(child.args[0].value, str)):
                names = [child.args[0].value]
            for name in names:
                target = _resolve(name)
                if target is not None and target != module:
                    yield target, function, child.lineno
            yield from visit(child, inner)

    yield from visit(tree, "")


def _component(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _allowed(source: str, target: str) -> bool:
    src, dst = _component(source), _component(target)
    if src == dst:
        return True
    rule = ALLOWED[src]
    parts = target.split(".")[1:]
    return "*" in rule or dst in rule or any(".".join(parts[:k]) in rule for k in range(2, len(parts) + 1))


def _edges() -> dict[str, set[str]]:
    """The import graph, exempt entry-point calls left out."""
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for module, path in MODULES.items():
        for target, function, _ in _imports(module, path):
            if (module, function, target) not in EXEMPT:
                graph[module].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_every_component_has_a_row() -> None:
    assert len(MODULES) > 50  # the walk found the package
    missing = sorted({_component(m) for m in MODULES} - set(ALLOWED))
    assert not missing, f"place these in tests/test_layering.py ALLOWED and docs/ARCHITECTURE.md: {missing}"


def test_the_table_itself_has_no_cycle() -> None:
    graph = {c: {r.split(".")[0] for r in rule if r != "*"} - {c} for c, rule in ALLOWED.items()}
    assert _cycles(graph) == []


def test_imports_go_only_where_the_table_allows() -> None:
    bad = [f"{module}:{line} ({function or 'module level'}) imports {target}"
           for module, path in MODULES.items()
           for target, function, line in _imports(module, path)
           if (module, function, target) not in EXEMPT and not _allowed(module, target)]
    assert not bad, "imports against the layers (tests/test_layering.py ALLOWED):\n" + "\n".join(bad)


def test_no_import_cycle_between_modules() -> None:
    assert _cycles(_edges()) == []


def test_every_exemption_is_still_needed() -> None:
    found = {(m, f, t) for m, path in MODULES.items() for t, f, _ in _imports(m, path)}
    assert set(EXEMPT) <= found, f"stale exemptions: {sorted(set(EXEMPT) - found)}"


@pytest.mark.parametrize("source,target,ok", [
    ("nemo_muon.accounting.planner", "nemo_muon.layerwise.optimizer", False),
    ("nemo_muon.layerwise.optimizer", "nemo_muon.accounting.ownership_plan", True),
    ("nemo_muon.recipes.systems", "nemo_muon.megatron.bridge.perf_presets", True),
    ("nemo_muon.recipes.systems", "nemo_muon.megatron.shared.engine", False),
    ("nemo_muon.megatron.bridge.container", "nemo_muon.recipes.systems", False),
    ("nemo_muon.train.loop", "nemo_muon.megatron.bridge.container", False),
])
def test_the_rule_reads_as_documented(source: str, target: str, ok: bool) -> None:
    assert _allowed(source, target) is ok
