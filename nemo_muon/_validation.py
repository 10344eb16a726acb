"""Error-message helpers: every validation error names the field, the value and what is allowed."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any


def fail(field: str, value: Any, allowed: str) -> ValueError:
    """Build the project's standard validation error (the caller raises it)."""
    return ValueError(f"{field} must be {allowed}; got {value!r}")


def check_choice(field: str, value: Any, choices: Iterable[Any]) -> None:
    """Raise unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{field} must be one of {choices}; got {value!r}")


def check_range(
    field: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """Raise unless ``value`` is a real number inside the interval (NaN always fails)."""
    lo_b = "[" if low_inclusive else "("
    hi_b = "]" if high_inclusive else ")"
    interval = f"{lo_b}{'-inf' if low is None else low}, {'inf' if high is None else high}{hi_b}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ValueError(f"{field} must be a number in {interval}; got {value!r}")
    ok = True
    if low is not None:
        ok = ok and (value >= low if low_inclusive else value > low)
    if high is not None:
        ok = ok and (value <= high if high_inclusive else value < high)
    if not ok:
        raise ValueError(f"{field} must be a number in {interval}; got {value!r}")


def check_positive_int(field: str, value: Any, *, minimum: int = 1) -> None:
    """Raise unless ``value`` is an int >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}; got {value!r}")
