"""Checkpoints of our optimizers' state inside Megatron-Core, through its ``dist_checkpointing``, whatever its shape.

Megatron's optimizer wrappers (`Float16OptimizerWithFloat16Params`, `FP32Optimizer`) turn every state tensor into a
`ShardedTensor` of the parameter's layout (``dist_checkpointing.optimizer.make_sharded_optimizer_tensor`` asserts the
state is shaped like the parameter) and keep one ``step`` common to all parameters. SOAP's Kronecker factors and
eigenbases (m x m, n x n), its full-size moments under tensor parallelism and NorMuon's row / column second moments are
not shaped like the parameter, and SOAP's ``step`` belongs to each matrix.

`adopt_wrapper` switches each wrapper holding one of our optimizers to a subclass that checkpoints the state like
this:

* every state tensor shaped like the parameter, as Megatron does (``optimizer.state.<key>.<param key>``);
* every other state tensor, ``step`` included, as a `ShardedTensor` of its own, keyed by the state key and the
  parameter's checkpoint key (``optimizer.state.nemo_muon.<key>.<param key>``), with one leading axis per axis the
  parameter is fragmented along (layers, experts, tensor-parallel shards) and the parameter's replica id.

Why tensors keyed by the parameter, and not sharded objects: they go through DCP's tensor path (no pickling, the
dtype kept, the shape checked at load against the placeholder state the loading optimizer built), and the key names
the parameter and not the rank, so a checkpoint resumes at another data-parallel size: the owner of a matrix after the
resume reads its factors wherever they were written. Resuming at another tensor-parallel size is not supported (the
fragment axes differ). Under tensor parallelism, state that is the same on every TP rank (SOAP's
full-size factors) is written once per TP rank, like any fragment.

`guard_layer_wise_file`: Megatron-Bridge 0.3 / 0.4 also write the layer-wise optimizer's whole state with
``torch.save`` at every save, to one file per DP rank at the save root, outside every checkpoint (Megatron-Bridge
#2307: each save replaces the previous one's, and no resume reads it). Ours writes that file only inside a checkpoint
folder.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from itertools import chain
from typing import Any

import torch

from nemo_muon.megatron.shared.checkpoint_files import inside_checkpoint_folder
from nemo_muon.megatron.shared.class_switch import same_identity, switch_class

logger = logging.getLogger(__name__)

OWN_STATE_KEY = "nemo_muon_state"
"""Where the state Megatron cannot shard sits in the wrapper's (sharded) state dict, next to ``state``: param index
(the optimizer's own numbering) -> state key -> tensor."""
KEY_PREFIX = "optimizer.state.nemo_muon"
"""Checkpoint keys of that state: ``<prefix>.<state key>.<the parameter's checkpoint key>``."""


def shaped_like(value: Any, param: torch.Tensor) -> bool:
    """Whether Megatron's wrapper can shard this state value with its parameter's layout."""
    return isinstance(value, torch.Tensor) and tuple(value.shape) == tuple(param.shape)


def _pieces(sharded: Any) -> list[Any]:
    """The ShardedTensors a model parameter's checkpoint entry writes: itself, or what its factory builds that shares
    the first built tensor's key (Megatron's SwiGLU factory writes [gate; up] as two fragments of one key)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    if not isinstance(sharded, ShardedTensorFactory):
        return [sharded]
    built = sharded.build()
    tensors = [v for v in nested_values(built if isinstance(built, dict) else {0: built}) if isinstance(v, ShardedTensor)]
    return [t for t in tensors if t.key == tensors[0].key]


def fragment_axes(model_param: Any) -> list[tuple[int, int]]:
    """(this rank's fragment index, how many fragments) along each axis the parameter is split along in the
    checkpoint; the pieces of one parameter (a factory's) count as one fragment."""
    pieces = _pieces(model_param)
    axes = []
    for axis, (size, fragments) in enumerate(zip(pieces[0].global_shape, pieces[0].axis_fragmentations, strict=True)):
        indices = sorted({piece.global_offset[axis] * fragments // size for piece in pieces})
        count = fragments // len(indices)
        if count > 1:
            axes.append((indices[0] % count, count))
    return axes


def state_tensor(model_param: Any, state_key: str, value: torch.Tensor) -> Any:
    """``value`` (state of the parameter ``model_param`` describes) as a ShardedTensor keyed by the parameter."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    axes = fragment_axes(model_param)
    offsets = [(axis, index, count) for axis, (index, count) in enumerate(axes)]
    return ShardedTensor.from_rank_offsets(f"{KEY_PREFIX}.{state_key}.{model_param.key}", value, *offsets,
                                           replica_id=model_param.replica_id, prepend_axis_num=len(axes))


def _state_part(state_dict: dict[str, Any]) -> dict[str, Any]:
    """The torch optimizer's own dict inside a wrapper's state dict (Float16: under ``optimizer``; FP32: itself)."""
    return state_dict["optimizer"] if "optimizer" in state_dict else state_dict


def _set_aside(optimizer: torch.optim.Optimizer) -> dict[torch.Tensor, dict[str, Any]]:
    """Take every state value Megatron cannot shard out of ``optimizer.state``; returns them by parameter."""
    aside = {}
    for p, state in optimizer.state.items():
        own = {k: v for k, v in state.items() if not shaped_like(v, p)}
        for k, v in own.items():
            if not isinstance(v, torch.Tensor):
                raise TypeError(f"{type(optimizer).__name__}: state[{k!r}] is a {type(v).__name__}; only tensors can "
                                "be checkpointed through Megatron's dist_checkpointing")
            del state[k]
        if own:
            aside[p] = own
    return aside


def _params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters in its state dict's numbering."""
    return [p for group in optimizer.param_groups for p in group["params"]]


def _state_built(optimizer: torch.optim.Optimizer, config: Any = None) -> None:
    """Megatron's state init hook while the wrapper's own sharded state dict runs: the state is already built."""


def _checkpoint_class(base: type) -> type:
    """``base`` (a Megatron optimizer wrapper class) checkpointing our optimizer's state of any shape (module doc);
    same name, module and layout, so a built wrapper's class can be switched to it."""

    class WithOwnStateCheckpoint(base):  # type: ignore[misc, valid-type]
        def _model_order(self) -> Iterable[torch.Tensor]:
            """The model parameters in the optimizer's numbering (what Megatron's wrapper maps to checkpoint keys)."""
            groups = getattr(self, "float16_groups", None)
            return chain.from_iterable(groups) if groups is not None else self.get_parameters()

        def sharded_state_dict(self, model_sharded_state_dict: Any, is_loading: bool = False, **kwargs: Any) -> Any:
            from megatron.core.dist_checkpointing.mapping import LocalNonpersistentObject
            from megatron.core.dist_checkpointing.optimizer import get_param_id_to_sharded_param_map

            init_state = self.init_state_fn
            if is_loading:  # the placeholder state the load copies into, built once, before a part is set aside
                init_state(self.optimizer, self.config)
            aside = _set_aside(self.optimizer)
            self.init_state_fn = _state_built
            try:
                out = super().sharded_state_dict(model_sharded_state_dict, is_loading, **kwargs)
            finally:
                self.init_state_fn = init_state
                for p, own in aside.items():
                    self.optimizer.state[p].update(own)
            by_id = get_param_id_to_sharded_param_map(model_sharded_state_dict, self._model_order())
            own_state = {}
            for index, p in enumerate(_params(self.optimizer)):
                if p in aside:
                    own_state[index] = {k: state_tensor(by_id[index], k, v) for k, v in aside[p].items()}
            _state_part(out)[OWN_STATE_KEY] = own_state if own_state else LocalNonpersistentObject(own_state)
            return out

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            own_state = _state_part(state_dict).pop(OWN_STATE_KEY, None) or {}
            super().load_state_dict(state_dict)
            params = _params(self.optimizer)
            for index, own in own_state.items():
                p = params[int(index)]
                self.optimizer.state[p].update({k: v.to(p.device) for k, v in own.items()})

    return same_identity(WithOwnStateCheckpoint, base)


_SWITCHED_CLASSES: dict[type, type] = {}
"""A Megatron class -> its subclass here (`class_switch.switch_class`)."""


def adopt_wrapper(wrapper: Any) -> None:
    """Switch one Megatron wrapper of our optimizer to its own-state checkpointing subclass (idempotent)."""
    switch_class(wrapper, _checkpoint_class, _SWITCHED_CLASSES)


def _file_guard_class(base: type) -> type:
    """``base`` (Megatron's layer-wise optimizer class) whose torch-format copy of its state is written only inside a
    checkpoint's own folder; same name, module and layout."""

    class WithFileInCheckpointFolder(base):  # type: ignore[misc, valid-type]
        def save_state_dict_to_file(self, filename: str) -> None:
            """Megatron-Bridge 0.3 / 0.4 call this at every save, whatever the format, with
            ``<save root>/layer_wise_optimizer_<dp rank>.pt`` (Megatron-Bridge #2307): one file outside every
            checkpoint, replaced by each later save and never read by their resume, while the torch_dist checkpoint
            already holds this state (``sharded_state_dict``). That file is not written (logged once); a path inside
            a checkpoint folder (``iter_<7 digits>`` / ``release``: Megatron-LM's torch format) is."""
            if inside_checkpoint_folder(filename):
                super().save_state_dict_to_file(filename)
                return
            if not getattr(self, "_skipped_file_logged", False):
                self._skipped_file_logged = True
                logger.info("not writing %s: it lies outside every checkpoint folder, so each save would replace "
                            "it (Megatron-Bridge #2307); the checkpoint's own files hold this optimizer state",
                            filename)

    return same_identity(WithFileInCheckpointFolder, base)


def guard_layer_wise_file(optimizer: Any) -> None:
    """Switch a Megatron layer-wise optimizer to writing its torch-format file only inside a checkpoint folder."""
    switch_class(optimizer, _file_guard_class, _SWITCHED_CLASSES)
