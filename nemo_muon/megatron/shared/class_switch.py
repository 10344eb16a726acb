"""Specialise an object Megatron-Core built: switch it to a same-named subclass that overrides a few methods.

Megatron's builders construct the optimizer objects themselves (``get_megatron_optimizer``), so behaviour of ours is
added after construction: the object's class becomes a subclass of its own class with the same layout, name, module
and docstring (logs, reprs and ``isinstance`` checks see what they saw before). One subclass per base class and maker,
made on first use; switching is idempotent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def same_identity(subclass: type, base: type) -> type:
    """Give ``subclass`` the name, qualified name, module and docstring of ``base``; returns it."""
    subclass.__name__, subclass.__qualname__ = base.__name__, base.__qualname__
    subclass.__module__, subclass.__doc__ = base.__module__, base.__doc__
    return subclass


def switch_class(obj: Any, make_subclass: Callable[[type], type], made: dict[type, type]) -> None:
    """Switch ``obj`` to ``make_subclass(type(obj))`` (cached in ``made``: base -> subclass); idempotent."""
    base = type(obj)
    if base in made.values():
        return
    if base not in made:
        made[base] = make_subclass(base)
    obj.__class__ = made[base]
