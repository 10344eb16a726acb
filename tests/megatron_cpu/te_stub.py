"""The Transformer Engine import stub that lets Megatron-Bridge 0.3.0's configs import on a machine without TE.

Bridge guards every Transformer Engine import but two: ``megatron/bridge/peft/lora_layers.py:20`` and
``megatron/bridge/peft/lora.py:21`` (``import transformer_engine.pytorch as te``), reached from
``megatron.bridge.training.config`` through ``megatron.bridge.peft``; ``lora_layers.py:81`` subclasses ``te.Linear``
at import time. `bridge_imports_without_te` imports Bridge with an ``__import__`` hook that answers
``import transformer_engine...`` with a fake module *only* for the code of those two modules; nothing is put into
``sys.modules``, so every other (guarded) ``import transformer_engine`` in Bridge and Megatron-Core still finds TE
absent and their ``HAVE_TE`` flags stay False. The fake ``Linear`` refuses to be instantiated: pretraining never
builds LoRA layers.

Bridge 0.4 / 0.5's ``megatron.bridge.recipes`` (its library recipes) also imports its diffusion recipes, whose WAN
utils import TE's C extension unguarded (``megatron/bridge/diffusion/models/wan/utils.py:20``, ``import
transformer_engine_torch as tex``, used inside functions only); `bridge_recipes_import_without_te` answers that one
import with an empty module, for that importer only (`TEX_STUBBED_MODULES`).
"""

from __future__ import annotations

import builtins
import importlib
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager

STUBBED_MODULES: tuple[str, ...] = ("megatron.bridge.peft.lora_layers", "megatron.bridge.peft.lora")
"""The Bridge modules that import Transformer Engine unguarded: the only importers the stub answers."""
TEX_STUBBED_MODULES: tuple[str, ...] = ("megatron.bridge.diffusion.models.wan.utils",)
"""The Bridge 0.4 / 0.5 modules that import ``transformer_engine_torch`` unguarded on the way to the library recipes."""
SERVED: list[str] = []
"""Which stubbed module imported the fake TE, in order (the test checks the stub is still needed, by whom)."""


class _StubTELinear:
    """Stands in for ``te.Linear`` (a base class) and ``te.ops.Sequential`` (an annotation); never instantiable."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        raise RuntimeError("transformer_engine is a test-only import stub here (tests/megatron_cpu/te_stub.py)")


def _fake_te() -> types.ModuleType:
    te = types.ModuleType("transformer_engine")
    te_pytorch = types.ModuleType("transformer_engine.pytorch")
    te_ops = types.ModuleType("transformer_engine.pytorch.ops")
    te_pytorch.Linear = _StubTELinear  # type: ignore[attr-defined]  # lora_layers.py:81 (base class)
    te_ops.Sequential = _StubTELinear  # type: ignore[attr-defined]  # lora_layers.py:238 (annotation, def time)
    te_pytorch.ops = te_ops  # type: ignore[attr-defined]
    te.pytorch = te_pytorch  # type: ignore[attr-defined]
    return te


@contextmanager
def _te_for_stubbed_modules() -> Iterator[None]:
    real_import = builtins.__import__
    fake = _fake_te()

    def hooked(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002 - __import__'s own signature
        importer = (globals or {}).get("__name__")
        if level == 0 and importer in STUBBED_MODULES and name.split(".")[0] == "transformer_engine":
            SERVED.append(importer)
            return fake.pytorch if fromlist and name == "transformer_engine.pytorch" else fake
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = hooked
    try:
        yield
    finally:
        builtins.__import__ = real_import


def bridge_imports_without_te() -> None:
    """Import Bridge's two unguarded-TE modules with the stub (idempotent); TE stays absent for everything else."""
    if all(name in sys.modules for name in STUBBED_MODULES):
        return
    if "transformer_engine" in sys.modules:
        raise RuntimeError("transformer_engine is installed; the stub is only for machines without it")
    with _te_for_stubbed_modules():
        for name in STUBBED_MODULES:
            importlib.import_module(name)


def bridge_recipes_import_without_te() -> None:
    """`bridge_imports_without_te`, then the modules of `TEX_STUBBED_MODULES` this Bridge has, with an empty
    ``transformer_engine_torch`` for them alone, so that ``megatron.bridge.recipes`` imports (idempotent)."""
    bridge_imports_without_te()
    real_import = builtins.__import__

    def hooked(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002 - __import__'s own signature
        importer = (globals or {}).get("__name__")
        if level == 0 and importer in TEX_STUBBED_MODULES and name == "transformer_engine_torch":
            SERVED.append(importer)
            return types.ModuleType("transformer_engine_torch")
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = hooked
    try:
        for name in TEX_STUBBED_MODULES:
            if name in sys.modules:
                continue
            try:
                importlib.import_module(name)
            except ModuleNotFoundError as e:  # not in this Bridge (0.3): nothing to answer
                if not e.name or not name.startswith(e.name):
                    raise
    finally:
        builtins.__import__ = real_import
