"""Recipe -> Megatron-Bridge ConfigContainer mapping, checked against the pinned Bridge 0.3.0 without importing it.

Bridge cannot be imported on a CPU machine (Transformer Engine), so the field names come from its wheel
(`pip download --no-deps megatron-bridge==0.3.0`), read with `ast`, plus the real dataclasses of the Megatron-Core
it runs on in NGC 26.02 (0.16.1, imported in a subprocess).
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from nemo_muon.recipes import get_recipe, list_recipes
from nemo_muon.recipes.overrides import apply_overrides
from nemo_muon.recipes.systems import BRIDGE_PERF_LAYOUTS

from nemo_muon.config.optimizer import AdamWConfig, SoapConfig
from nemo_muon.megatron.bridge import (
    BRIDGE_BASE_RECIPES,
    BRIDGE_VERSION,
    PRECISION_TO_BRIDGE,
    bridge_field_overrides,
    bridge_optimizer_spec,
    bridge_recipe_kwargs,
    pipeline_layout,
)
from tests.test_megatron_optimizer_config import mcore016_report

MEGATRON_RECIPES = [n for n in list_recipes() if get_recipe(n).backend == "megatron"]
RECIPE_KWARGS_CLASS = {"kimi_k2": "KimiK2CommonKwargs", "qwen3_30b_a3b": "Qwen3MoeCommonKwargs"}
MODEL_PROVIDER = {"kimi_k2": "KimiK2Provider", "qwen3_30b_a3b": "Qwen3MoEModelProvider"}
SECTION_CLASS = {
    "train": "TrainingConfig", "scheduler": "SchedulerConfig", "ddp": "DistributedDataParallelConfig",
    "mixed_precision": "MixedPrecisionConfig", "dataset": "GPTDatasetConfig", "checkpoint": "CheckpointConfig",
    "logger": "LoggerConfig", "rng": "RNGConfig",
}
MCORE_BASES = {"model": "TransformerConfig", "ddp": "DistributedDataParallelConfig", "dataset": "GPTDatasetConfig"}


@pytest.fixture(scope="module")
def bridge_src() -> Path:
    root = Path(tempfile.gettempdir()) / "nemo_muon_test_cache" / f"megatron-bridge-{BRIDGE_VERSION}"
    if not (root / ".complete").exists():
        dl = Path(tempfile.mkdtemp())
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(dl),
                        f"megatron-bridge=={BRIDGE_VERSION}"], check=True, timeout=300)
        with zipfile.ZipFile(next(dl.glob("*.whl"))) as whl:
            whl.extractall(root)
        (root / ".complete").touch()
    return root / "megatron" / "bridge"


@pytest.fixture(scope="module")
def classes(bridge_src) -> dict[str, tuple[set[str], list[str]]]:
    """Every class in the Bridge wheel: name -> (annotated field names, base class names)."""
    out: dict[str, tuple[set[str], list[str]]] = {}
    for path in bridge_src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                fields = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and
                          isinstance(s.target, ast.Name)}
                bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                prev = out.get(node.name, (set(), []))
                out[node.name] = (prev[0] | fields, prev[1] + bases)
    return out


@pytest.fixture(scope="module")
def mcore016_fields() -> dict[str, set[str]]:
    """Field names of megatron-core 0.16.1's TransformerConfig, DDP config, GPTDatasetConfig and OptimizerConfig."""
    return {k: set(v) for k, v in mcore016_report()["fields"].items()}


def _fields(classes, name: str, seen: frozenset = frozenset()) -> set[str]:
    if name not in classes or name in seen:
        return set()
    own, bases = classes[name]
    return own.union(*(_fields(classes, b, seen | {name}) for b in bases))


def _section_fields(section: str, model: str, classes, mcore016_fields) -> set[str]:
    cls = MODEL_PROVIDER[model] if section == "model" else SECTION_CLASS[section]
    fields = _fields(classes, cls)
    if section in MCORE_BASES:
        fields |= mcore016_fields[MCORE_BASES[section]]
    return fields


@pytest.mark.parametrize("name", MEGATRON_RECIPES)
def test_every_mapped_field_exists_in_bridge_030(name, classes, mcore016_fields):
    recipe = get_recipe(name)
    model = recipe.model.name
    knobs = BRIDGE_PERF_LAYOUTS.get((model, recipe.system.gpu))
    for section, values in bridge_field_overrides(recipe, bridge_knobs=knobs).items():
        missing = set(values) - _section_fields(section, model, classes, mcore016_fields)
        assert not missing, f"{section}: {sorted(missing)} are not fields of Bridge {BRIDGE_VERSION}"
    missing = set(bridge_recipe_kwargs(recipe)) - _fields(classes, RECIPE_KWARGS_CLASS[model])
    assert not missing, f"{BRIDGE_BASE_RECIPES[model]} takes no {sorted(missing)}"
    if isinstance(recipe.optimizer, SoapConfig):  # Bridge 0.3.0 runs on megatron-core 0.16: Muon only
        with pytest.raises(ValueError, match="SOAP needs megatron-core >= 0.18"):
            bridge_optimizer_spec(recipe, fields=mcore016_fields["OptimizerConfig"])
    else:
        spec = bridge_optimizer_spec(recipe, fields=mcore016_fields["OptimizerConfig"])
        assert set(spec.kwargs) <= mcore016_fields["OptimizerConfig"]
        expected = "adam" if isinstance(recipe.optimizer, AdamWConfig) else "dist_muon"
        assert spec.bridge_optimizer == expected


def test_base_recipes_and_precisions_exist_in_bridge_030(bridge_src):
    for target in BRIDGE_BASE_RECIPES.values():
        module, fn = target.split(":")
        path = bridge_src.parent.parent / (module.replace(".", "/") + ".py")
        assert fn in {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
    mp = ast.parse((bridge_src / "training" / "mixed_precision.py").read_text())
    assert set(PRECISION_TO_BRIDGE.values()) <= {n.name for n in mp.body if isinstance(n, ast.FunctionDef)}


def _bridge_kimi_layouts(bridge_src) -> dict[tuple[int, int], list | None]:
    """Bridge 0.3.0's `map_pp_vp_to_layout` table, evaluated from its source (pure list arithmetic)."""
    tree = ast.parse((bridge_src / "recipes" / "kimi" / "kimi_k2.py").read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.Assign) and
                getattr(n.targets[0], "id", "") == "map_pp_vp_to_layout")
    return eval(compile(ast.Expression(node.value), "kimi_k2.py", "eval"), {"__builtins__": {}})


def test_kimi_pipeline_layouts_equal_bridges(bridge_src):
    table = _bridge_kimi_layouts(bridge_src)
    checked = 0
    for (pp, vp), layout in table.items():
        recipe = apply_overrides(get_recipe("kimi_k2_muon"), [f"parallelism.pp={pp}", f"parallelism.vp={vp}",
                                                               "parallelism.ep=16", "trainer.global_batch_size=8192"])
        if layout is not None:
            assert pipeline_layout(recipe) == layout, (pp, vp)
            checked += 1
    assert checked >= 5


def test_weight_decay_is_as_set_and_perf_knobs_are_bridges():
    recipe = apply_overrides(get_recipe("kimi_k2_muon"), ["optim.weight_decay=0.07"])
    over = bridge_field_overrides(recipe, bridge_knobs=BRIDGE_PERF_LAYOUTS[("kimi_k2", "gb300")])
    assert over["scheduler"]["start_weight_decay"] == over["scheduler"]["end_weight_decay"] == 0.07
    assert over["model"]["moe_flex_dispatcher_backend"] == "hybridep"
    assert over["model"]["recompute_modules"] == ["mla_up_proj"]
    assert over["mixed_precision"] == {"fp8_param_gather": False, "reuse_grad_buf_for_mxfp8_param_ag": False}
    assert over["ddp"]["use_distributed_optimizer"] is False
    adam = bridge_field_overrides(get_recipe("kimi_k2_adamw"))
    assert adam["ddp"]["use_distributed_optimizer"] is True and adam["mixed_precision"] == {}
    kw = bridge_recipe_kwargs(get_recipe("kimi_k2_adamw_bf16"))
    assert (kw["optimizer_type"], kw["precision_config"]) == ("adam", "bf16_mixed")


def test_parallel_sizes_reach_the_library_recipe_and_the_model_provider():
    want = {"tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 4,
            "virtual_pipeline_model_parallel_size": 4, "context_parallel_size": 1, "expert_model_parallel_size": 64,
            "sequence_parallel": False}
    recipe = get_recipe("kimi_k2_muon")  # TP1 PP4 VP4 CP1 EP64
    kw, model = bridge_recipe_kwargs(recipe), bridge_field_overrides(recipe)["model"]
    assert {k: kw[k] for k in want} == want and {k: model[k] for k in want} == want
    assert model["expert_tensor_parallel_size"] == recipe.parallelism.etp
    qwen = bridge_recipe_kwargs(get_recipe("qwen3_30b_a3b_muon"))  # VP1: Megatron's None, not 1
    assert qwen["virtual_pipeline_model_parallel_size"] is None and qwen["expert_model_parallel_size"] == 8
