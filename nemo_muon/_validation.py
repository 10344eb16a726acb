"""Error-message helpers: every validation error names the field, the value and what is allowed.

Numbers must be finite (``inf`` and ``1e400`` are refused like NaN), integers are capped at `MAX_INT` unless a
tighter bound is given, and values are shown at most `MAX_SHOWN` characters long, so no input can make an error
message unbounded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

MAX_INT = 2**53
"""The largest integer a config field takes by default: every integer up to it is exact in float64 (FLOP and
memory accounting multiply them as floats)."""
MAX_SHOWN = 200
"""Longest value representation an error message quotes; longer ones are cut and marked with their length."""


def shown(value: Any) -> str:
    """``repr(value)``, cut to `MAX_SHOWN` characters (an integer too long to print is described by its size)."""
    try:
        text = repr(value)
    except ValueError:  # an int beyond sys.get_int_max_str_digits()
        return f"<an integer of {value.bit_length()} bits>"
    if len(text) > MAX_SHOWN:
        return f"{text[:MAX_SHOWN]}... ({len(text)} characters)"
    return text


def fail(field: str, value: Any, allowed: str) -> ValueError:
    """Build the project's standard validation error (the caller raises it)."""
    return ValueError(f"{field} must be {allowed}; got {shown(value)}")


def check_choice(field: str, value: Any, choices: Iterable[Any]) -> None:
    """Raise unless ``value`` is one of ``choices``."""
    choices = tuple(choices)
    try:
        ok = value in choices
    except TypeError:  # an unhashable value compared with a choice
        ok = False
    if not ok:
        raise ValueError(f"{field} must be one of {choices}; got {shown(value)}")


def check_range(
    field: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_inclusive: bool = True,
    high_inclusive: bool = True,
) -> None:
    """Raise unless ``value`` is a finite real number inside the interval (NaN and +-inf always fail)."""
    lo_b = "[" if low_inclusive and low is not None else "("
    hi_b = "]" if high_inclusive and high is not None else ")"
    interval = f"{lo_b}{'-inf' if low is None else low}, {'inf' if high is None else high}{hi_b}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{field} must be a number in {interval}; got {shown(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int too large for a float
        finite = False
    ok = finite
    if ok and low is not None:
        ok = value >= low if low_inclusive else value > low
    if ok and high is not None:
        ok = value <= high if high_inclusive else value < high
    if not ok:
        raise ValueError(f"{field} must be a number in {interval}; got {shown(value)}")


def check_positive_int(field: str, value: Any, *, minimum: int = 1, maximum: int | None = None) -> None:
    """Raise unless ``value`` is an int in [``minimum``, ``maximum``] (``maximum`` None = `MAX_INT`)."""
    high = MAX_INT if maximum is None else maximum
    if isinstance(value, bool) or not isinstance(value, int) or not (minimum <= value <= high):
        allowed = f"an integer >= {minimum}" if maximum is None and (not isinstance(value, int) or value < high) \
            else f"an integer in [{minimum}, {high}]"
        raise ValueError(f"{field} must be {allowed}; got {shown(value)}")


_VALIDATED_AS = "_nemo_muon_validated_as"
"""Where `validate_once` keeps the field values a config was last validated with (outside its fields)."""


def validate_once(config: Any) -> None:
    """``config.validate()`` unless the config (a dataclass) was validated with exactly its current field values:
    a value is validated where it enters (at construction), and a recipe that checks its sections again re-validates
    only those changed since (recipes and overrides may mutate them in place)."""
    import copy
    import dataclasses

    values = copy.deepcopy([getattr(config, f.name) for f in dataclasses.fields(config)])
    if config.__dict__.get(_VALIDATED_AS) == values:
        return
    config.validate()
    config.__dict__[_VALIDATED_AS] = values
