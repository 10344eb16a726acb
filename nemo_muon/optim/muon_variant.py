"""The base of Muon's variants that change its orthogonalized update with state of their own (NorMuon, AdaMuon).

A variant is `nemo_muon.Muon` plus: its registry config (``config_class``, a `MuonConfig` subclass) whose fields
beyond Muon's are the variant's keyword arguments and param-group fields (a group may set its own; each group is
validated by that config, naming the field); a state per fused part (Q, K, V; gate, up) and per 3-D expert stack,
stored in the parameter's state as ``<key>_<part>`` and built for a checkpoint load by `placeholder_state`
(``part_state``); and ``_post_orthogonalize``, what it does to each part between Newton–Schulz and Muon's scale.
Tensor parallelism is refused: a variant's normalization reads whole matrices, which a TP shard cuts.

A variant's ``__init__`` takes its own fields as keywords, hands them to `_take_variant_fields`, then calls
``Muon.__init__`` with the rest.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from nemo_muon.config.optimizer import MuonConfig
from nemo_muon.optim.fused import split_parts
from nemo_muon.optim.muon import Muon
from nemo_muon.optim.routed import MatrixItem

Shape = tuple[int, ...]


class MuonVariant(Muon):
    """Base class; see the module docstring. Not used directly."""

    config_class: type[MuonConfig] = MuonConfig
    """The variant's registry config: validates its fields, at construction and in every param group."""

    def _take_variant_fields(self, lr: float, weight_decay: float, fields: dict[str, Any],
                             tp_group: dist.ProcessGroup | None) -> None:
        """Validate the variant's own ``fields`` (raises naming the field) and keep them as the param groups'
        defaults; refuse a tensor-parallel group. Called before ``Muon.__init__``, which adds the groups."""
        self.config_class(lr=lr, weight_decay=weight_decay, **fields)
        if tp_group is not None and dist.get_world_size(tp_group) > 1:
            raise ValueError(f"{self.label}'s tp_group must be None or of size 1 (its normalization needs whole "
                             f"matrices); got a group of {dist.get_world_size(tp_group)} ranks: use Muon under "
                             "tensor parallelism")
        self._variant_defaults = dict(fields)

    def _validate_group(self, group: dict[str, Any]) -> None:
        """A new param group without the variant's fields takes the defaults; then `Muon`'s check and the variant's
        config (a refused group is not added; the message names it: ``param_groups[i]: adamuon.beta2 ...``)."""
        for key, value in self._variant_defaults.items():
            group.setdefault(key, value)
        super()._validate_group(group)
        self.config_class(lr=group["lr"], weight_decay=group["weight_decay"],
                          **{key: group[key] for key in self._variant_defaults})

    def part_state(self, shape: Shape) -> dict[str, Shape]:
        """State key -> shape of the state one part of ``shape`` holds (none here)."""
        return {}

    def placeholder_state(self, p: torch.Tensor) -> None:
        """The state a checkpoint load copies into: `Muon`'s, and every part's (`part_state`), in fp32."""
        super().placeholder_state(p)
        parts = split_parts(torch.empty(p.shape, device="meta"), self.route_of(p), self._names[p])
        for index, part in enumerate(parts):
            for key, shape in self.part_state(tuple(part.shape)).items():
                self.state[p].setdefault(f"{key}_{index}", torch.zeros(shape, device=p.device))

    @staticmethod
    def part_tensor(it: MatrixItem, key: str, part: int, like: torch.Tensor) -> torch.Tensor:
        """Part ``part``'s state ``key`` of ``it``: zeros shaped like ``like`` the first time."""
        value = it.state.get(f"{key}_{part}")
        if value is None:
            value = it.state[f"{key}_{part}"] = torch.zeros_like(like)
        return value
