"""Click parameter types the ``nemo-muon`` commands share. Torch-free."""

from __future__ import annotations

import math
from typing import Any

import click

from nemo_muon._validation import shown


class FinitePositive(click.ParamType):
    """A finite number > 0 (click's FloatRange lets ``inf`` and ``nan`` through)."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """The value as a float, or a usage error naming the option, the value and what is allowed."""
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            self.fail(f"must be a finite number > 0; got {shown(value)}", param, ctx)
        return number


FINITE_POSITIVE = FinitePositive()
