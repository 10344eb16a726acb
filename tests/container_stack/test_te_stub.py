"""The Transformer Engine import stub (tests/megatron_cpu/te_stub.py) is still needed and still enough, on the
installed Megatron-Bridge: each check runs in a fresh interpreter of this environment, where nothing has imported
Bridge yet.

* needed: without the stub, importing Bridge's config fails on ``transformer_engine``, raised from one of
  `STUBBED_MODULES`; with the stub answering all but one of them, it fails at the one left out (each is needed);
* enough: with the stub, Bridge's config, optimizer setup and the library recipes we build on import; the stub
  served exactly `STUBBED_MODULES`; ``transformer_engine`` stays out of ``sys.modules`` and unimportable, so every
  guarded ``HAVE_TE`` still sees TE absent.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_muon.megatron.bridge_03.library_recipe import BRIDGE_BASE_RECIPES
from tests.megatron_cpu.te_stub import STUBBED_MODULES

REPO = Path(__file__).resolve().parents[2]
IMPORTED = ("megatron.bridge.training.config", "megatron.bridge.training.optim",
            *sorted({target.split(":")[0] for target in BRIDGE_BASE_RECIPES.values()}))
"""What the harness and the package import from Bridge (the config first: it is what reaches the stubbed modules)."""
PROBE = r"""
import importlib, importlib.util, json, sys, traceback
stub, modules = sys.argv[1], sys.argv[2:]
from tests.megatron_cpu import te_stub
out = {"te_installed": importlib.util.find_spec("transformer_engine") is not None, "ok": True}
try:
    if stub != "none":
        te_stub.STUBBED_MODULES = tuple(m for m in te_stub.STUBBED_MODULES if m != stub)
        te_stub.bridge_imports_without_te()
    for name in modules:
        importlib.import_module(name)
except ModuleNotFoundError as err:
    importers = [f.f_globals.get("__name__", "") for f, _ in traceback.walk_tb(err.__traceback__)]
    out.update(ok=False, missing=err.name, importer=[n for n in importers if n.startswith("megatron.")][-1:])
out["served"] = sorted(set(te_stub.SERVED))
out["te_in_sys_modules"] = sorted(n for n in sys.modules if n.split(".")[0] == "transformer_engine")
try:
    import transformer_engine  # noqa: F401
    out["te_importable_after"] = True
except ModuleNotFoundError:
    out["te_importable_after"] = False
lora_layers = sys.modules.get("megatron.bridge.peft.lora_layers")
out["lora_te_linear_is_stub"] = lora_layers is not None and lora_layers.te.Linear is te_stub._StubTELinear
print(json.dumps(out))
"""


def _probe(stub: str) -> dict:
    """Import `IMPORTED` in a fresh interpreter; ``stub`` = 'none' (no stub), 'all', or a stubbed module left out."""
    run = subprocess.run([sys.executable, "-c", PROBE, stub, *IMPORTED], cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["te_installed"] is False, "transformer_engine is installed: the stub is only for machines without it"
    return out


def test_without_the_stub_bridge_fails_on_transformer_engine_imported_by_a_stubbed_module() -> None:
    out = _probe("none")
    assert out["ok"] is False
    assert out["missing"].split(".")[0] == "transformer_engine", out
    assert out["importer"] and out["importer"][0] in STUBBED_MODULES, out
    assert out["served"] == []


@pytest.mark.parametrize("left_out", STUBBED_MODULES)
def test_each_stubbed_module_is_still_needed(left_out: str) -> None:
    out = _probe(left_out)
    assert out["ok"] is False, f"Bridge imports with {left_out} left out of the stub: drop it from STUBBED_MODULES"
    assert out["missing"].split(".")[0] == "transformer_engine", out
    assert out["importer"] == [left_out], out


def test_with_the_stub_bridge_imports_and_transformer_engine_stays_absent() -> None:
    out = _probe("all")
    assert out["ok"] is True, out
    assert out["served"] == sorted(STUBBED_MODULES), f"the stub served {out['served']}, documented {STUBBED_MODULES}"
    assert out["te_in_sys_modules"] == [] and out["te_importable_after"] is False, out
    assert out["lora_te_linear_is_stub"] is True
