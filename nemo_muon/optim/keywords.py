"""Unknown keyword arguments of the optimizers refused in one line that names the allowed ones.

`RoutedOptimizer` subclasses get their ``__init__`` wrapped (``checked_init``): a keyword the class (and, through
``**kwargs``, its bases) does not take raises `UnknownKeywordError` naming it, what it is called here when it is an
AdamW or ``torch.optim.Muon`` habit (``HABITS``), and the allowed keywords. The signature seen by ``inspect`` is the
original one (``functools.wraps``).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

HABITS: dict[str, str] = {
    "betas": "adamw_betas", "eps": "adamw_eps", "adjust_lr_fn": "scale_mode", "ns_coefficients": "coefficients",
    "amsgrad": "", "maximize": "", "foreach": "", "fused": "", "capturable": "", "differentiable": "",
}
"""Keywords of ``torch.optim.AdamW`` / ``torch.optim.Muon`` -> what they are called here ("" = not offered)."""


class UnknownKeywordError(TypeError, ValueError):
    """An unknown keyword argument: a TypeError as Python raises for one, and a ValueError as every validation error
    of the package."""


@functools.cache
def allowed_keywords(cls: type, base: type) -> tuple[str, ...]:
    """The keyword names ``cls(...)`` takes: its ``__init__``'s, and its bases' (up to ``base``) while a signature
    passes ``**kwargs`` on."""
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is base or not issubclass(klass, base):
            continue
        params = inspect.signature(init).parameters.values()
        names += [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and p.name != "self" and p.name not in names]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return tuple(names)


def unknown_keyword_message(label: str, unknown: list[str], allowed: tuple[str, ...]) -> str:
    """One line: the unknown keywords, what the habits among them are called here, the allowed keywords."""
    notes = []
    for key in unknown:
        here = HABITS.get(key)
        if here and here in allowed:
            notes.append(f"{key!r} is called {here!r} here")
        elif here == "":
            notes.append(f"{key!r} is not offered")
    extra = f" ({'; '.join(notes)})" if notes else ""
    return f"{label} got unknown keyword argument(s) {', '.join(map(repr, unknown))}{extra}; allowed: {', '.join(allowed)}"


def checked_init(init: Callable[..., None], cls: type, base: type) -> Callable[..., None]:
    """``init`` that first refuses keywords ``cls`` does not take (module docstring)."""

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        allowed = allowed_keywords(cls, base)
        unknown = [k for k in kwargs if k not in allowed]
        if unknown:
            raise UnknownKeywordError(unknown_keyword_message(getattr(cls, "label", cls.__name__), unknown, allowed))
        init(self, *args, **kwargs)

    return wrapper
