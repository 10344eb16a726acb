"""``opt.routes()``: the table of where every parameter went and why (name, shape, update, reason), to check by eye.

``print(opt.routes())`` prints it aligned; ``opt.routes()`` is also a tuple of `RouteRow` to check in code
(``{r.name: r.update for r in opt.routes()}``).
"""

from __future__ import annotations

from typing import NamedTuple

from nemo_muon.optim.routing import ADAMW, GateUpLayout, QKVLayout, Route

PART_NAMES: dict[type, str] = {GateUpLayout: "gate, up", QKVLayout: "q, k, v"}
"""How the parts of each fused layout are called in the table."""


class RouteRow(NamedTuple):
    """One parameter: its name, shape, the update it gets and why."""

    name: str
    shape: tuple[int, ...]
    update: str
    reason: str


def update_label(route: Route, shape: tuple[int, ...], label: str, *, splits: bool) -> str:
    """The update column: ``AdamW``, or ``label`` (the optimizer's), per expert for a 3-D stack, and the parts a fused
    weight is split into when the optimizer splits (``splits``: Muon yes, SOAP preconditions fused weights whole)."""
    if route.algorithm == ADAMW:
        return "AdamW"
    out = label + (" per expert" if len(shape) == 3 else "")
    if splits and route.layout is not None:
        out += f", {PART_NAMES[type(route.layout)]} apart"
    return out


class RouteTable(tuple):
    """A tuple of `RouteRow` whose ``str`` is an aligned text table (one line per parameter)."""

    def __str__(self) -> str:
        head = RouteRow("name", (), "update", "reason")
        cells = [(r.name, "shape" if r is head else str(tuple(r.shape)), r.update, r.reason) for r in (head, *self)]
        widths = [max(len(c[i]) for c in cells) for i in range(3)]
        return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {d}".rstrip() for a, b, c, d in cells)
