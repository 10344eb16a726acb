"""Seeded fuzz of override keys and values through every entry point (`tests/entry_points.py`).

A few hundred random override lists (valid keys with typed, boundary and hostile values; unknown keys; malformed
items) go to ``--dryrun``, ``plan``, ``launch --dry-run`` and `build_recipe`, plus the job entry where the recipe is
refused. Whatever the input: no traceback anywhere, all entry points agree, and every refusal is one message that
names the field, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import time
import types
import typing
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest
from nemo_muon.recipes import get_recipe
from nemo_muon.recipes.execute import build_recipe
from nemo_muon.recipes.overrides import SECTION_ALIASES, SECTIONS, TOP_LEVEL_KEYS

from nemo_muon.config.limits import GPUS_PER_NODE, MAX_CPU_PROCESSES_PER_NODE
from tests.entry_points import REFUSED_EXIT, EntryPoints, describe

SEED = 20261113
CASES = 300
BUDGET_S = 60.0
RECIPES: tuple[tuple[str, int], ...] = (
    ("tiny_kimi_k2_muon", 6), ("tiny_qwen3_moe_adamw", 4), ("tiny_kimi_k2_soap", 3), ("qwen3_30b_a3b_muon", 2),
    ("qwen3_30b_a3b_soap", 1), ("kimi_k2_adamw", 1))
"""(recipe, weight): mostly the tiny CPU recipes, whose plans are instant; the megatron ones too."""
HOSTILE: tuple[str, ...] = (
    "", " ", "none", "null", "nan", "inf", "-inf", "1e400", "-1", "0", "1", "2", "3", "7", "1e3", "0x10", "1_000",
    "9" * 30, "9" * 5000, "true", "maybe", "(1,2,3)", "(0.9,0.95)", "abc", "λ", "../../escape", "/tmp/a:/etc",
    "/tmp/a,/b", "a b", "a\nb", "$(touch pwned)", "'quoted'", "muon", "soap", "adamw", "normuon", "tiny_qwen3_moe", "kimi_k2",
)
BAD_KEYS: tuple[str, ...] = ("optimizer.nope", "nosection.x", "trainer", "model.", "env.BAD-NAME", ".x", "optim",
                             "log.nope", "=", "parallelism.tp.x")


def _hint(key: str, recipe: Any) -> Any:
    head, _, field = key.partition(".")
    head = SECTION_ALIASES.get(head, head)
    if not field or head not in SECTIONS:
        return None
    return get_type_hints(type(getattr(recipe, head))).get(field)


def _typed_values(hint: Any, current: Any) -> list[str]:
    """Values aimed at ``hint``'s edges: the current value scaled, zero, negatives, huge, non-finite, each choice."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is typing.Literal:
        return [*args, "bogus"]
    if origin in (typing.Union, types.UnionType):
        return [v for a in args if a is not type(None) for v in _typed_values(a, current)] + ["none"]
    if hint is bool:
        return ["true", "false", "yes", "2"]
    if hint is int:
        c = current if isinstance(current, int) and not isinstance(current, bool) else 1
        return [str(c), str(c * 2), str(max(c // 2, 0)), str(c + 1), "0", "-1", str(2**53 + 1), str(10**26), "1.5"]
    if hint is float:
        c = current if isinstance(current, float) else 1.0
        return [repr(c), repr(c * 10), "0", "-0.0", "1e-300", "1e300", "1e400", "inf", "nan", "-1"]
    if origin is tuple:
        return ["(0.9,0.95)", "(0.5,0.999)", "(0.9)", "(1.5,0.9)", "(0.9,nan)"]
    return ["x", "runs2", "/tmp/nm-fuzz", "~/nm-fuzz", "../x"]


def _case(rng: random.Random) -> tuple[str, list[str]]:
    names, weights = zip(*RECIPES, strict=True)
    name = rng.choices(names, weights)[0]
    recipe = get_recipe(name)
    keys = [f"{s}.{f.name}" for s in SECTIONS for f in dataclasses.fields(getattr(recipe, s)) if f.init]
    keys += [*TOP_LEVEL_KEYS, "optimizer", "model", "env.NM_FUZZ", "optim.lr", "log.run_name"]
    overrides = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        roll = rng.random()
        if roll < 0.05:
            overrides.append(rng.choice(BAD_KEYS) + "=1")
            continue
        if roll < 0.08:
            overrides.append(rng.choice(("noequals", "optim.lr", "x==1")))
            continue
        key = rng.choice(keys)
        hint = _hint(key, recipe)
        head, _, field = key.partition(".")
        section = getattr(recipe, SECTION_ALIASES.get(head, head), None)
        current = getattr(section, field, None) if field else None
        pool = _typed_values(hint, current) if hint is not None and rng.random() < 0.7 else list(HOSTILE)
        overrides.append(f"{key}={rng.choice(pool)}")
    return name, overrides


def _field_names(override: str) -> set[str]:
    """Names a refusal of ``override`` may use for its field ('override' for an item that is not key=value)."""
    key, sep, _ = override.partition("=")
    if not sep or not key.strip():
        return {"override"}
    head, _, field = key.partition(".")
    return {n for n in (field.rsplit(".", 1)[-1], SECTION_ALIASES.get(head, head), key) if n}


def _check_refusal_message(message: str, overrides: list[str]) -> None:
    assert "Traceback" not in message and "\n" not in message.strip(), message
    # 'X must be ...; got V', or the mapping's 'X=V cannot be honoured by Megatron-Core: why; set X=...'
    assert re.search(r"\bmust\b|\bone of\b|has the fields|; set \S+=", message), f"says what is allowed: {message!r}"
    assert re.search(r"\bgot\b|=\S+ cannot be honoured", message), f"names the value: {message!r}"
    named = set().union(*(_field_names(o) for o in overrides))
    assert any(n in message for n in named), f"names the field (one of {sorted(named)}): {message!r}"


def _numbers(obj: Any) -> list[float]:
    if dataclasses.is_dataclass(obj):
        return [x for f in dataclasses.fields(obj) for x in _numbers(getattr(obj, f.name))]
    if isinstance(obj, (tuple, list)):
        return [x for v in obj for x in _numbers(v)]
    return [obj] if isinstance(obj, (int, float)) and not isinstance(obj, bool) else []


def _check_accepted(recipe: Any) -> None:
    """What an accepted recipe must be, whatever the overrides: finite, bounded, a run folder inside its root."""
    bad = [x for x in _numbers(recipe) if not (math.isfinite(x) if isinstance(x, float) else abs(x) <= 2**53)]
    assert not bad, f"accepted non-finite or unbounded numbers {bad[:5]}"
    run_name = recipe.logging.run_name or recipe.name
    assert "/" not in run_name and run_name not in (".", "..") and run_name.isprintable(), run_name
    assert not set(recipe.logging.root) & set(":, \n"), recipe.logging.root
    assert recipe.scheduler.warmup_steps < recipe.trainer.max_steps
    assert recipe.system.gpus_per_node <= GPUS_PER_NODE.get(recipe.system.gpu, MAX_CPU_PROCESSES_PER_NODE)


@pytest.fixture(scope="module")
def entry_points(tmp_path_factory: pytest.TempPathFactory) -> EntryPoints:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NEMORUN_HOME", str(tmp_path_factory.mktemp("nemorun")))
        yield EntryPoints()


def test_fuzzed_overrides_never_crash_agree_everywhere_and_explain_refusals(entry_points, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    root = f"logging.root={tmp_path / 'runs'}"
    start, refused = time.monotonic(), 0
    for i in range(CASES):
        name, fuzzed = _case(rng)
        overrides = [root, *fuzzed]
        try:
            _check_accepted(build_recipe(name, overrides))
            message = None
        except ValueError as e:
            message = " ".join(str(e).split())
        outcomes = entry_points.all(name, overrides, job=message is not None)
        where = f"case {i}: {name} {fuzzed}\n{describe(outcomes)}"
        assert not any(o.crashed for o in outcomes.values()), where
        if message is None:
            assert all(o.accepted for o in outcomes.values()), where
            continue
        refused += 1
        malformed = any("=" not in o for o in fuzzed)
        for entry, outcome in outcomes.items():
            assert outcome.exit_code == REFUSED_EXIT[entry], where
            if entry == "dryrun" and malformed:
                continue  # NeMo-Run parses an argument without '=' itself (its own message)
            assert message in " ".join(outcome.output.split()), (entry, message, where)
        _check_refusal_message(message, fuzzed)
    elapsed = time.monotonic() - start
    assert 0.3 * CASES < refused < 0.95 * CASES, f"{refused} of {CASES} refused: the mix tests both sides"
    assert elapsed < BUDGET_S, f"{CASES} cases took {elapsed:.0f} s"
    assert not (tmp_path / "runs").exists() and not list(Path.cwd().glob("pwned*"))


PLAN_OPTIONS: dict[str, tuple[str, ...]] = {
    "--model-tflops": ("713", "1051", "400", "0", "-5", "nan", "inf", "1e30", "5000", "5000.1", "abc", ""),
    "--step-time": ("1.5", "0", "-1", "nan", "inf", "1e-30", "x"),
    "--gpus": ("2", "8", "16", "256", "0", "-8", "7", "1e3", "99999999999"),
    "--gpu": ("gb300", "h100", "b200", "cpu", "GB300", "nope", "", "../x"),
}
"""The step-time model's and the planner's command-line inputs, with typed, boundary and hostile values."""
OPTION_NAMES: dict[str, tuple[str, ...]] = {"--model-tflops": ("model-tflops", "model_tflops"),
                                           "--step-time": ("step-time", "step_time"),
                                           "--gpus": ("gpus", "world"), "--gpu": ("gpu",)}
"""How a refusal may name each option: its flag, its field, or (``--gpus``) the world size it sets."""
PLAN_RECIPES = ("tiny_kimi_k2_muon", "qwen3_30b_a3b_muon", "qwen3_30b_a3b_muon", "qwen3_30b_a3b_soap", "kimi_k2_muon",
                "kimi_k2_adamw")
"""Weighted to the recipes that plan fastest (a Kimi K2 plan takes about a second)."""
PLAN_CASES = 40


def test_fuzzed_plan_inputs_never_crash_and_name_the_option(tmp_path: Path, monkeypatch) -> None:
    """``nemo-muon plan`` with random step-time-model inputs (and NorMuon): a JSON plan, or one ``Error:`` line that
    names the option and the value; never a traceback, nothing written."""
    import json

    from click.testing import CliRunner
    from nemo_muon.launchers.cli import main

    monkeypatch.chdir(tmp_path)
    rng = random.Random(SEED + 1)
    refused = 0
    for i in range(PLAN_CASES):
        chosen = rng.sample(sorted(PLAN_OPTIONS), k=rng.choice((1, 2)))
        name = rng.choice(PLAN_RECIPES)
        valid = {"--model-tflops": "400", "--step-time": "1.5", "--gpu": "h100",
                 "--gpus": str(get_recipe(name).system.world_size)}
        args = ["plan", "--recipe", name, "--json"]
        args += [f"{o}={valid[o] if rng.random() < 0.5 else rng.choice(PLAN_OPTIONS[o])}" for o in chosen]
        if rng.random() < 0.3:
            args += ["--set", "optimizer=normuon"]
        result = CliRunner().invoke(main, args)
        where = f"case {i}: {args}\n{result.output[-2000:]}"
        assert result.exception is None or isinstance(result.exception, SystemExit), where
        assert "Traceback" not in result.output, where
        if result.exit_code == 0:
            assert json.loads(result.stdout)["recipe"] == args[2], where
            continue
        refused += 1
        assert result.exit_code == REFUSED_EXIT["plan"], where
        error = [line for line in result.output.splitlines() if line.startswith("Error:")]
        # ours: '<field> must ...; got <value>'; click's: "Invalid value for '--opt': <value> is not ..."
        assert len(error) == 1 and ("got" in error[0] or error[0].startswith("Error: Invalid value for '")), where
        named = {n for o in chosen for n in OPTION_NAMES[o]} | {"optimizer"}
        layout_field = "--gpus" in chosen and re.search(r"\b(trainer|parallelism|system)\.\w+", error[0])
        assert any(n in error[0] for n in named) or layout_field, where  # a world size refused by the field it breaks
    assert 3 < refused < PLAN_CASES - 3, f"{refused} of {PLAN_CASES} refused: the mix tests both sides"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("release", ["nope", "26.03", "../26.02", "26.02 ", "26.02;ls"])
def test_an_unknown_release_is_one_line_naming_the_known_ones(release: str, monkeypatch) -> None:
    """Release selection (``$NEMO_MUON_RELEASE``) read by ``nemo-muon doctor``."""
    from click.testing import CliRunner
    from nemo_muon.launchers.cli import main

    monkeypatch.setenv("NEMO_MUON_RELEASE", release)
    result = CliRunner().invoke(main, ["doctor"])
    lines = [line for line in result.output.splitlines() if line.startswith("Error:")]
    if release.strip() == "26.02":
        assert result.exit_code in (0, 1) and not lines, result.output  # surrounding blanks are stripped
        return
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert lines == [f"Error: container release must be one of ('26.02', '26.02.01', '26.04', '26.06', '26.08'); "
                     f"got {release!r}"], result.output
