"""The walk of one hyperparameter through our code (docs/ARCHITECTURE.md, "The walk of optimizer.lr"): which of our
functions are called with the value itself as an argument, from the recipe factory to the update, recorded with a
profile hook. A sentinel value no default has marks it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SENTINEL = 0.0123456789
"""The learning rate the walk follows (an override: no recipe or default holds it)."""


@dataclass
class Walk:
    """Our functions (``module.qualname``) called with the value as an argument, and how many times each."""

    calls: dict[str, int] = field(default_factory=dict)

    @property
    def functions(self) -> list[str]:
        return sorted(self.calls)

    def report(self) -> str:
        return "\n".join(f"{name} x{count}" for name, count in sorted(self.calls.items()))


def walk(fn: Callable[[], Any], value: float = SENTINEL, package: str = "nemo_muon") -> tuple[Any, Walk]:
    """Run ``fn()`` and record every function of ``package`` whose arguments, on entry, include ``value`` itself."""
    seen = Walk()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event != "call" or not frame.f_globals.get("__name__", "").startswith(package):
            return
        code = frame.f_code
        names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
        local = frame.f_locals
        if any(type(local.get(n)) is float and local[n] == value for n in names):
            key = f"{frame.f_globals['__name__']}.{code.co_qualname}"
            seen.calls[key] = seen.calls.get(key, 0) + 1

    sys.setprofile(profile)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, seen
