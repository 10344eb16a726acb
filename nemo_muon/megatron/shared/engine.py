"""Our matrix optimizers (Muon, SOAP, NorMuon, ...: every registry entry with engine 'nemo_muon') as the matrix optimizer
of Megatron-Core's layer-wise distributed optimizer: what every Megatron-Core generation shares.

What is Megatron's, reused as is: the parameter split (2-D weights that are not embedding / output layer -> the
matrix update; everything else -> Megatron's Adam), its param groups (lr / wd multipliers, expert flags),
`Float16OptimizerWithFloat16Params` (fp32 master weights of the bf16 model), `LayerWiseDistributedOptimizer` (whole
matrices per data-parallel rank, gradient-norm / zero-count reduction, the param all-gather, checkpoints) and its
Adam for the rest. What is ours: the matrix update, `engine_class(<our optimizer>)` (e.g. ``MegatronMuon`` =
`nemo_muon.Muon` over Megatron's params: our Newton–Schulz, TP modes over Megatron's tensor-parallel group,
fused-weight splitting by parameter name) and the step-level non-finite policy (`nemo_muon.megatron.shared.nonfinite`).

Hyperparameters are stated once: the recipe's validated config (``ours``) travels to the build and its fields are
the optimizer's keyword arguments (`engine_kwargs`); Megatron's `OptimizerConfig` contributes only what frameworks
adjust on it (lr, weight decay), and Megatron's scheduler writes the rate into the param groups every step.

How each generation plugs the class in: `nemo_muon.megatron.core_016_017.assembly` (0.16 / 0.17: Megatron's
pieces assembled around it) and `nemo_muon.megatron.core_018_plus.registry_entry` (>= 0.18: Megatron's
emerging-optimizer registry); `nemo_muon.megatron.generations` picks one.

Megatron's Float16 wrapper swaps each bf16 parameter in the optimizer's groups for its fp32 master copy; our
optimizer knows its parameters by the model's tensors (for names and fused layouts), so `finish_wrapping` moves
that knowledge to the master copies once the optimizer is built, and gives each wrapper of ours the checkpointing of
state of any shape (`nemo_muon.megatron.shared.state_checkpoint`: SOAP's factors, NorMuon's moments).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from nemo_muon.config.optimizer import BaseOptimizerConfig
from nemo_muon.megatron.shared.state_checkpoint import adopt_wrapper, guard_layer_wise_file
from nemo_muon.optim.muon import Muon
from nemo_muon.optim.routed import RoutedOptimizer
from nemo_muon.optim.routing import MATRIX, QKVLayout
from nemo_muon.registry import OptimizerSpec, resolve, spec_for


class _OnMegatronParams:
    """What our optimizers need to run on the parameters Megatron-Core hands its emerging optimizer: every parameter
    gets the matrix update (Megatron already sent the others to Adam), names come from the model (``param_names``:
    id(param) -> name), and `rekey` follows Megatron's swap of bf16 params for their fp32 master copies."""

    _routes: dict
    _names: dict

    def __init__(self, param_groups: Iterable[dict[str, Any]], *, param_names: Mapping[int, str],
                 **kwargs: Any) -> None:
        super().__init__(self._megatron_groups(param_groups, param_names), **kwargs)  # type: ignore[call-arg]

    @staticmethod
    def _megatron_groups(param_groups: Iterable[dict[str, Any]], param_names: Mapping[int, str]) -> list[dict]:
        groups = []
        for group in param_groups:
            group = dict(group)
            group["param_names"] = [param_names.get(id(p)) for p in group["params"]]
            group["algorithm"] = MATRIX
            groups.append(group)
        return groups

    def rekey(self, pairs: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> None:
        """Parameters replaced in the groups (model param -> fp32 master copy): carry their route and name over."""
        for old, new in pairs:
            if old in self._routes:
                self._routes[new] = self._routes.pop(old)
                self._names[new] = self._names.pop(old)
            if isinstance(self, Muon):
                self.move_split(old, new)


@functools.cache
def engine_class(optimizer_class: type) -> type:
    """``Megatron<Class>``: our optimizer class over the matrix parameters Megatron-Core hands its emerging optimizer
    (``param_names`` keyword: id(param) -> the model's name, for fused layouts); other keyword arguments: the
    class's."""
    label = f"{optimizer_class.label} (nemo-muon, Megatron layer-wise)"
    return type(f"Megatron{optimizer_class.__name__}", (_OnMegatronParams, optimizer_class),
                {"label": label, "__module__": __name__, "__doc__": engine_class.__doc__})


def engine_class_of(spec: OptimizerSpec) -> type:
    """The Megatron-side class of a registry entry's implementation."""
    implementation = resolve(spec.implementation)
    if not (isinstance(implementation, type) and issubclass(implementation, RoutedOptimizer)):
        raise ValueError(f"optimizer {spec.name!r} runs inside Megatron with engine 'nemo_muon' only if its "
                         f"implementation is one of nemo-muon's routed optimizers; got {spec.implementation!r}")
    return engine_class(implementation)


def init_placeholder_state(opt: torch.optim.Optimizer, config: Any = None) -> None:
    """Our optimizer's state before a checkpoint is loaded into a fresh optimizer (Megatron's state init hook)."""
    for group in opt.param_groups:
        for p in group["params"]:
            opt.placeholder_state(p)  # type: ignore[attr-defined]


def parameter_names(model_chunks: Iterable[torch.nn.Module]) -> dict[int, str]:
    """id(param) -> its name in its model chunk (DDP / Float16Module prefixes included; layouts match segments),
    prefixed ``model<k>.`` with chunk k of several (virtual pipeline stages name their layers alike: ownership plans
    key matrices by name)."""
    chunks = list(model_chunks)
    return {id(p): (f"model{k}." if len(chunks) > 1 else "") + name
            for k, chunk in enumerate(chunks) for name, p in chunk.named_parameters()}


FUSED_QKV = "linear_qkv"
"""The name segment of Megatron's fused query / key / value weight (``SelfAttention.linear_qkv``)."""


def fused_layouts(model_config: Any, tp_size: int, names: Iterable[str] = (FUSED_QKV,)) -> dict[str, Any]:
    """The fused weights of a Megatron model among ``names`` (parameter names): ``linear_qkv`` per query group (GQA),
    split into Q, K, V, where a parameter is one; none otherwise (a model without attention needs no head sizes)."""
    if not any(FUSED_QKV in name.split(".") for name in names):
        return {}
    heads, groups = model_config.num_attention_heads, model_config.num_query_groups or model_config.num_attention_heads
    if heads % tp_size or groups % tp_size:
        raise ValueError(f"num_attention_heads={heads} and num_query_groups={groups} must be multiples of the tensor-"
                         f"parallel size {tp_size}")
    return {FUSED_QKV: QKVLayout(heads // tp_size, groups // tp_size, model_config.kv_channels)}


def _tp(pg_collection: Any) -> tuple[Any, int]:
    tp_group = getattr(pg_collection, "tp", None)
    return tp_group, 1 if tp_group is None else torch.distributed.get_world_size(tp_group)


def engine_kwargs(ours: BaseOptimizerConfig, config: Any, model_chunks: list[Any], pg_collection: Any) -> dict[str, Any]:
    """Keyword arguments of ``engine_class_of(spec_for(ours))``: the fields of our validated config (stated once),
    lr and weight decay from Megatron's config (frameworks and Megatron's scheduler adjust them there), the model's
    names and layouts, and the TP group. The matrix optimizer raises on a non-finite gradient: the step-level policy
    (`nemo_muon.megatron.shared.nonfinite`) decides first, on every rank alike."""
    spec = spec_for(ours)
    tp_group, tp_size = _tp(pg_collection)
    expt_tp = getattr(pg_collection, "expt_tp", None)
    if expt_tp is not None and torch.distributed.get_world_size(expt_tp) != tp_size:
        raise ValueError(f"expert tensor parallelism ({torch.distributed.get_world_size(expt_tp)}) must equal tensor "
                         f"parallelism ({tp_size}) for engine 'nemo_muon' (one TP group for all matrices)")
    names = parameter_names(model_chunks)
    kwargs = {**ours.optimizer_kwargs(), "lr": config.lr, "weight_decay": config.weight_decay, "nonfinite": "raise",
              "tp_group": tp_group if tp_size > 1 else None, "param_names": names}
    if "fused_layouts" in spec.runtime_args:
        kwargs["fused_layouts"] = fused_layouts(model_chunks[0].config, tp_size, names.values())
    return kwargs


def megatron_nodes(optimizer: Any) -> Iterator[Any]:
    """``optimizer`` and every optimizer chained inside it (Megatron's chained / layer-wise optimizers), depth first:
    the one walk over Megatron's chained optimizers."""
    yield optimizer
    for sub in getattr(optimizer, "chained_optimizers", ()):
        yield from megatron_nodes(sub)


def megatron_leaves(optimizer: Any) -> Iterator[Any]:
    """The leaves of `megatron_nodes`: the wrappers (``Float16Optimizer...``, ``FP32Optimizer``) around one torch
    optimizer each."""
    return (node for node in megatron_nodes(optimizer) if not hasattr(node, "chained_optimizers"))


def ours_in(optimizer: Any, kind: type = RoutedOptimizer) -> Iterator[tuple[Any, Any]]:
    """(Megatron wrapper, our optimizer inside it) for every optimizer of ours of ``kind`` in ``optimizer``."""
    for wrapper in megatron_leaves(optimizer):
        raw = getattr(wrapper, "optimizer", None)
        if isinstance(raw, kind):
            yield wrapper, raw


def finish_wrapping(optimizer: Any) -> int:
    """After Megatron wrapped our optimizer in `Float16OptimizerWithFloat16Params` (or `FP32Optimizer`): move routes to
    the master copies, switch the wrapper to checkpointing our state of any shape, and the layer-wise optimizer to
    writing its torch-format file only inside a checkpoint folder (`state_checkpoint`).

    Walks the (chained / layer-wise) Megatron optimizer; returns how many of ours were found (0 = none).
    """
    for node in megatron_nodes(optimizer):
        if hasattr(node, "save_state_dict_to_file"):  # Megatron's layer-wise optimizer, wherever it is chained
            guard_layer_wise_file(node)
    found = 0
    for wrapper, raw in ours_in(optimizer, _OnMegatronParams):
        found += 1
        for old_group, new_group in zip(getattr(wrapper, "float16_groups", []),
                                        getattr(wrapper, "fp32_from_float16_groups", []), strict=True):
            raw.rekey(zip(old_group, new_group, strict=True))
        adopt_wrapper(wrapper)
    return found


def nonfinite_policy(ours: BaseOptimizerConfig) -> str:
    """The step-level non-finite policy of our config (`nemo_muon.megatron.shared.nonfinite`). Our matrix optimizer itself
    keeps ``nonfinite='raise'``: the step-level policy decides first, on every rank alike."""
    return getattr(ours, "nonfinite", "raise")
