"""What Megatron-Bridge 0.4's and 0.5's own performance runs set, recorded from their scripts, and the container they
make: the reference tests/newest_stack/test_bridge_recipes_04_05.py compares every megatron recipe with.

Those releases keep ``scripts/performance/`` outside the wheel, so the test cannot run them; the recording can, where
the repository is checked out at the tag. It runs the scripts' own composition (``run_script.py``: the builder of
``configs/<family>/``, the ``PerfEnvPlugin``'s manual-GC overrides, ``set_user_overrides`` with default options,
``set_post_overrides``) for each (model, GPU, precision, Kimi K2 optimizer type) a registered megatron recipe uses,
on its target GPU (`target_machine`) with the model read from the config.json nemo-muon ships, and keeps the fields
whose value differs from the library recipe built alike (``tests/data/bridge_perf_runs_<tag>.json``, values as
``repr``). The test rebuilds the library recipe from the installed wheel and applies the recording: Bridge's perf
config, field for field. Record again after changing a recipe's key or the release (in that release's environment)::

    git -C <Megatron-Bridge checkout> worktree add /tmp/mb-v0.4.2 v0.4.2
    OMP_NUM_THREADS=1 .venv-ngc-26.04/bin/python -m tests.newest_stack.perf_runs /tmp/mb-v0.4.2/scripts/performance
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

from nemo_muon.megatron.bridge.hf_config import recipe_hf_config
from nemo_muon.megatron.bridge_04_05.library_recipe import LIBRARY_RECIPES, kimi_optimizer_type
from nemo_muon.megatron.bridge_04_05.perf_scripts import TAGS
from nemo_muon.versions import get_release, release_numbers

DATA = Path(__file__).resolve().parents[1] / "data"
STACK_RELEASES: dict[tuple[int, int], str] = {(0, 4): "26.04", (0, 5): "26.06"}
PERF_DTYPES: dict[str, str] = {"bf16": "bf16", "fp8_cs": "fp8_cs", "mxfp8": "fp8_mx"}
"""Our precision kinds -> the perf scripts' ``--compute_dtype``."""
FAMILIES: dict[str, str] = {"kimi_k2": "kimi", "qwen3_30b_a3b": "qwen"}


def installed_minor() -> tuple[int, int]:
    return release_numbers(importlib.metadata.version("megatron-bridge"))[:2]


def recording_path(minor: tuple[int, int]) -> Path:
    return DATA / f"bridge_perf_runs_{TAGS[minor]}.json"


def run_key(recipe: Any) -> str:
    """The perf run a recipe corresponds to: model/GPU/precision, and Kimi K2's optimizer type ('-' for Qwen3, whose
    one run is Adam's)."""
    optimizer = kimi_optimizer_type(recipe) if recipe.model.name == "kimi_k2" else "-"
    return f"{recipe.model.name}/{recipe.system.gpu}/{recipe.precision.kind}/{optimizer}"


def flat(container: Any) -> dict[str, str]:
    """``section.field`` -> repr of every field of every section (a section that is no dataclass: its own repr)."""
    out: dict[str, str] = {}
    for section in dataclasses.fields(container):
        value = getattr(container, section.name)
        if not dataclasses.is_dataclass(value):
            out[section.name] = repr(value)
            continue
        for f in dataclasses.fields(value):
            v = getattr(value, f.name, None)
            if not callable(v) or isinstance(v, enum.Enum):
                out[f"{section.name}.{f.name}"] = repr(v)
    return out


def library_container(recipe: Any) -> Any:
    """The library recipe the perf builder of ``recipe``'s run starts from (installed wheel, model read offline)."""
    module_name, function = LIBRARY_RECIPES[recipe.model.name].split(":")
    kwargs = {"optimizer_type": kimi_optimizer_type(recipe)} if recipe.model.name == "kimi_k2" else {}
    with recipe_hf_config(recipe):
        return getattr(importlib.import_module(module_name), function)(**kwargs)


def perf_run_fields(recipe: Any, recording: dict[str, Any]) -> dict[str, str]:
    """Bridge's perf config of ``recipe``'s run, flat: the library recipe with the recorded fields applied."""
    run = recording["runs"][run_key(recipe)]
    fields = {k: v for k, v in flat(library_container(recipe)).items() if k not in run["unset"]}
    fields.update(run["set"])
    return fields


def _record(scripts: Path) -> dict[str, Any]:
    """Run Bridge's perf scripts (a checkout's ``scripts/performance``) for every key the megatron recipes use."""
    from nemo_muon.recipes import get_recipe, list_recipes

    from tests.megatron_cpu.bridge_validation import target_machine

    sys.path.insert(0, str(scripts))
    from argument_parser import parse_cli_args
    from utils.overrides import set_cli_overrides, set_post_overrides, set_user_overrides
    from utils.utils import get_perf_optimized_recipe

    minor = installed_minor()
    te = get_release(STACK_RELEASES[minor]).transformer_engine
    recipes = {run_key(r): r for r in (get_recipe(n) for n in list_recipes()) if r.backend == "megatron"}
    runs = {}
    for key, recipe in sorted(recipes.items()):
        family, dtype, gpus = FAMILIES[recipe.model.name], PERF_DTYPES[recipe.precision.kind], recipe.system.world_size
        argv = ["-m", family, "-mr", recipe.model.name, "-ng", str(gpus), "--gpu", recipe.system.gpu, "-c", dtype]
        optimizer = key.rsplit("/", 1)[1]
        if optimizer != "-":
            argv += ["--optimizer_type", optimizer]
        args, _ = parse_cli_args().parse_known_args(argv)
        with target_machine(recipe.system.gpu, te), recipe_hf_config(recipe):
            cfg = get_perf_optimized_recipe(family, recipe.model.name, "pretrain", recipe.system.gpu, dtype, mock=True,
                                            config_variant="v1", optimizer_type=getattr(args, "optimizer_type", None))
            cfg = set_cli_overrides(cfg, ["train.manual_gc=true", "train.manual_gc_interval=100"])  # PerfEnvPlugin
            cfg = set_user_overrides(cfg, args)
            cfg = set_post_overrides(cfg, family, recipe.model.name, recipe.system.gpu, gpus, dtype, "pretrain")
            library = flat(library_container(recipe))
        perf = flat(cfg)
        runs[key] = {"set": {k: v for k, v in sorted(perf.items()) if library.get(k) != v},
                     "unset": sorted(set(library) - set(perf))}
    return {"tag": TAGS[minor], "runs": runs}


if __name__ == "__main__":
    from tests.megatron_cpu.te_stub import bridge_recipes_import_without_te

    bridge_recipes_import_without_te()
    recording = _record(Path(sys.argv[1]).resolve())
    path = recording_path(installed_minor())
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(recording, indent=1, sort_keys=True) + "\n")
    print(f"{path}: {len(recording['runs'])} runs")
