"""The ownership plan of the whole-tensor optimizer: one `PlanItem` per parameter, costed as the inner optimizer runs it.

The cost of a matrix is its update's FLOPs on the matrices the optimizer actually runs, from the optimizer's entry in
`nemo_muon.registry` (``spec.matrix``, the one cost model): the parameter is routed
(`nemo_muon.optim.routing.route_param`, with the fused-weight splits ``spec.matrix.routing`` gives), and an update
that runs per part (Muon's NS: ``per_part``) costs the sum of its parts, one that runs on the fused matrix (SOAP)
the whole; element-wise optimizers (AdamW) and AdamW-routed parameters cost 0 and are placed by bytes. With
``ns_split_target`` (an optimizer whose entry is ``splittable``) a 2-D matrix also carries its ``split_options``
(``accounting.ns_split``), and `whole_tensor_plan` lets LPT split the largest over aligned blocks of DP ranks. The stage
plans of ``nemo-muon plan`` use the same functions.

An optimizer factory is asked, not guessed: its optimizer is built once over the parameters (constructing Muon,
SOAP or a torch optimizer routes the parameters and allocates no state; the whole-tensor optimizer builds it once more over the
owned masters) and `factory_items` costs each parameter by the route that optimizer gives it (``route_of``: its own
``matrix_rule``, forced groups and fused layouts) and by its registry entry (``registry_name``), with its group's
hyperparameters. torch's ``torch.optim.Muon`` orthogonalizes every (2-D) tensor it holds: NS of the whole tensor.
Any other optimizer exposes no routing, so the whole-tensor optimizer cannot see a matrix cost; it is costed as element-wise (every
tensor 0, placed by bytes, as AdamW is), which is what torch's SGD / Adam / AdamW do; the whole-tensor optimizer does not guess
FLOPs it cannot see. A parameter the factory leaves out is never updated: cost 0. A factory's matrices are never
split (``ns_split_target`` is a config field).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from nemo_muon._validation import fail
from nemo_muon.accounting.ns_split import split_options
from nemo_muon.accounting.ownership_plan import OwnershipPlan, PlanItem, plan_ownership
from nemo_muon.optim.routing import MATRIX, QKVLayout, Route, route_param
from nemo_muon.registry import check_split_target, spec_for, spec_named
from nemo_muon.registry.cost import ns_cost


def is_factory(optimizer: Any) -> bool:
    """True for an optimizer factory (a callable ``named_params -> Optimizer``), False for a config."""
    return callable(optimizer) and not hasattr(optimizer, "optimizer_kwargs")


def matrix_route(name: str, shape: tuple[int, ...], optimizer: Any) -> Route | None:
    """The route the optimizer built from ``optimizer`` (a config) gives this parameter; None for an element-wise
    optimizer (AdamW) or a factory."""
    if is_factory(optimizer) or spec_for(optimizer).matrix is None:
        return None
    try:
        route = route_param(name, shape, **spec_for(optimizer).matrix.routing(optimizer))
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
    """The ownership unit of one parameter under a config (module doc); ``splittable`` adds the split options of
    2-D ones. A factory's items come from `factory_items`."""
    shape = tuple(p.shape)
    nbytes = p.numel() * p.element_size()
    if is_factory(optimizer):
        raise fail("optimizer", optimizer, "a registered optimizer config (a factory: factory_items)")
    route = matrix_route(name, shape, optimizer)
    if route is None:
        return PlanItem(name, shape, 0.0, nbytes)
    matrix = spec_for(optimizer).matrix
    cost = matrix.update_cost(shape, _parts(name, shape, route), vars(optimizer))
    options: tuple[Any, ...] = ()
    if splittable and matrix.splittable and len(shape) == 2:
        groups = None
        if isinstance(route.layout, QKVLayout):
            groups = shape[0] // sum(route.layout.group_shapes())
        options = split_options(list(_parts(name, shape, route)), steps=optimizer.ns_steps, query_groups=groups)
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
            if route.algorithm == MATRIX:
                cost = spec_named(built.registry_name).matrix.update_cost(shape, _parts(name, shape, route), group)
        elif group is not None and torch_muon is not None and isinstance(built, torch_muon):
            cost = ns_cost(shape, group["ns_steps"])
        items.append(PlanItem(name, shape, cost, p.numel() * p.element_size()))
    return items


def whole_tensor_plan(named: Sequence[tuple[str, torch.Tensor]], world: int, optimizer: Any, method: str, *,
                split: bool, built: torch.optim.Optimizer | None = None) -> OwnershipPlan:
    """The plan the whole-tensor optimizer executes for ``named`` over ``world`` ranks; ``split``: Muon's ``ns_split_target``.
    For a factory, ``built`` is its optimizer built over (at least) ``named``; None builds it here."""
    if is_factory(optimizer):
        items = factory_items(named, optimizer(list(named)) if built is None else built)
        return plan_ownership(items, world, method)  # type: ignore[arg-type]
    target = check_split_target(optimizer) if split else None
    items = [plan_item(n, p, optimizer, splittable=target is not None) for n, p in named]
    return plan_ownership(items, world, method, balance_target=target)  # type: ignore[arg-type]
