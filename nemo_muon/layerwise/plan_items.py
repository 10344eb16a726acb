"""The ownership plan of the layer-wise engine: one `PlanItem` per parameter, costed as the inner optimizer runs it.

The cost of a matrix is its update's FLOPs on the matrices the optimizer actually runs: Muon routes the parameter
(`nemo_muon.optim.routing.route_param`, with the config's ``split_gate_up`` / ``split_qkv``) and orthogonalizes each
fused part separately, so the cost is the sum of the parts' NS (``ownership.ns_cost``); SOAP preconditions a fused
weight whole (``soap_cost``); AdamW-routed parameters cost 0 and are placed by bytes. With Muon's
``ns_split_target`` a 2-D matrix also carries its ``split_options`` (``accounting.ns_split``), and `engine_plan` lets
LPT split the largest over aligned blocks of DP ranks. The stage plans of ``nemo-muon plan`` use the same functions.

An optimizer factory is asked, not guessed: its optimizer is built once over the parameters (constructing Muon,
SOAP or a torch optimizer routes the parameters and allocates no state; the engine builds it once more over the
owned masters) and `factory_items` costs each parameter by the route that optimizer gives it (``route_of``: its own
``matrix_rule``, forced groups and fused layouts): Muon the NS of the fused parts at its group's ``ns_steps``, SOAP
``soap_cost`` at the group's ``precondition_frequency``, AdamW-routed 0. torch's ``torch.optim.Muon`` orthogonalizes
every (2-D) tensor it holds: NS of the whole tensor. Any other optimizer exposes no routing, so the engine cannot see
a matrix cost; it is costed as element-wise (every tensor 0, placed by bytes, as `AdamWConfig` is), which is what
torch's SGD / Adam / AdamW do; the engine does not guess FLOPs it cannot see. A parameter the factory leaves out is
never updated: cost 0. A factory's matrices are never split (``ns_split_target`` is a `MuonConfig` field).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nemo_muon._validation import fail
from nemo_muon.accounting.ns_split import split_options
from nemo_muon.accounting.ownership import OwnershipPlan, PlanItem, ns_cost, plan_ownership, soap_cost
from nemo_muon.config.optimizer import MuonConfig, SoapConfig
from nemo_muon.optim.routing import MATRIX, QKVLayout, Route, route_param
from nemo_muon.optim.soap import SOAP


def is_factory(optimizer: Any) -> bool:
    """True for an optimizer factory (a callable ``named_params -> Optimizer``), False for a config."""
    return callable(optimizer) and not hasattr(optimizer, "optimizer_kwargs")


def matrix_route(name: str, shape: tuple[int, ...], optimizer: Any) -> Route | None:
    """The route Muon / SOAP built from ``optimizer`` (a config) gives this parameter; None for AdamW or a factory."""
    if not isinstance(optimizer, (MuonConfig, SoapConfig)):
        return None
    try:
        flags = ({"split_qkv": optimizer.split_qkv, "split_gate_up": optimizer.split_gate_up}
                 if isinstance(optimizer, MuonConfig) else {"split_qkv": False, "split_gate_up": False})
        route = route_param(name, shape, **flags)
    except ValueError:  # a shape or fused weight the optimizer refuses: it raises with the details when built
        return None
    return route if route.algorithm == MATRIX else None


def _parts(name: str, shape: tuple[int, ...], route: Route) -> list[tuple[int, ...]]:
    """The matrices NS runs on: the fused parts (stacked along rows; a 3-D stack keeps its expert dim)."""
    sizes = route.split_sizes(name, shape[-2])
    if sizes is None:
        return [shape]
    if isinstance(route.layout, QKVLayout):
        groups = shape[-2] // sum(sizes)
        sizes = [s * groups for s in sizes]
    return [(*shape[:-2], s, shape[-1]) for s in sizes]


def plan_item(name: str, p: torch.Tensor, optimizer: Any, *, splittable: bool) -> PlanItem:
    """The ownership unit of one parameter under a config (module doc); ``splittable`` adds Muon's split options
    for 2-D ones. A factory's items come from `factory_items`."""
    shape = tuple(p.shape)
    nbytes = p.numel() * p.element_size()
    if is_factory(optimizer):
        raise fail("optimizer", optimizer, "a MuonConfig, SoapConfig or AdamWConfig (a factory: factory_items)")
    route = matrix_route(name, shape, optimizer)
    if route is None:
        return PlanItem(name, shape, 0.0, nbytes)
    if isinstance(optimizer, SoapConfig):
        return PlanItem(name, shape, soap_cost(shape, optimizer.precondition_frequency), nbytes)
    parts = _parts(name, shape, route)
    cost = sum(ns_cost(part, optimizer.ns_steps) for part in parts)
    options: tuple[Any, ...] = ()
    if splittable and len(shape) == 2:
        groups = None
        if isinstance(route.layout, QKVLayout):
            groups = shape[0] // sum(route.layout.group_shapes())
        options = split_options([(r, c) for r, c in parts], steps=optimizer.ns_steps, query_groups=groups)
    return PlanItem(name, shape, cost, nbytes, split_options=options)


def factory_items(named: Sequence[tuple[str, torch.Tensor]], built: torch.optim.Optimizer) -> list[PlanItem]:
    """The ownership units of ``named`` under ``built``, the optimizer a factory built over them (module doc)."""
    group_of = {id(q): g for g in built.param_groups for q in g["params"]}
    torch_muon = getattr(torch.optim, "Muon", None)
    items = []
    for name, p in named:
        shape, group = tuple(p.shape), group_of.get(id(p))
        cost = 0.0
        if group is not None and hasattr(built, "route_of"):
            route = built.route_of(p)
            if route.algorithm == MATRIX and isinstance(built, SOAP):
                cost = soap_cost(shape, group["precondition_frequency"])
            elif route.algorithm == MATRIX:
                cost = sum(ns_cost(part, group["ns_steps"]) for part in _parts(name, shape, route))
        elif group is not None and torch_muon is not None and isinstance(built, torch_muon):
            cost = ns_cost(shape, group["ns_steps"])
        items.append(PlanItem(name, shape, cost, p.numel() * p.element_size()))
    return items


def engine_plan(named: Sequence[tuple[str, torch.Tensor]], world: int, optimizer: Any, method: str, *,
                split: bool, built: torch.optim.Optimizer | None = None) -> OwnershipPlan:
    """The plan the engine executes for ``named`` over ``world`` ranks; ``split``: Muon's ``ns_split_target``.
    For a factory, ``built`` is its optimizer built over (at least) ``named``; None builds it here."""
    if is_factory(optimizer):
        items = factory_items(named, optimizer(list(named)) if built is None else built)
        return plan_ownership(items, world, method)  # type: ignore[arg-type]
    target = optimizer.ns_split_target if split and isinstance(optimizer, MuonConfig) else None
    items = [plan_item(n, p, optimizer, splittable=target is not None) for n, p in named]
    return plan_ownership(items, world, method, balance_target=target)  # type: ignore[arg-type]
