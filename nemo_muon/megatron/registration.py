"""nemo-muon's matrix optimizers (Muon, SOAP, NorMuon, ...: every registry entry with engine 'nemo_muon') inside
Megatron-Core's layer-wise distributed optimizer, on both API generations.

What is Megatron's, reused as is: the parameter split (2-D weights that are not embedding / output layer ->
the matrix update; everything else -> Megatron's Adam), its param groups (lr / wd multipliers, expert flags),
`Float16OptimizerWithFloat16Params` (fp32 master weights of the bf16 model), `LayerWiseDistributedOptimizer`
(whole matrices per data-parallel rank, gradient-norm / zero-count reduction, the param all-gather, checkpoints) and
its Adam for the rest. What is ours: the matrix update, `engine_class(<our optimizer>)` (e.g. ``MegatronMuon`` =
`nemo_muon.Muon` over Megatron's params: our Newton–Schulz, TP modes over Megatron's tensor-parallel group,
fused-weight splitting by parameter name); on 0.16 the ownership by update cost (`nemo_muon.megatron.cost_balanced`); on
both the step-level non-finite policy (`nemo_muon.megatron.nonfinite`).

Hyperparameters are stated once: the recipe's validated config (``ours``) travels to the build and its fields are
the optimizer's keyword arguments (`engine_kwargs`); Megatron's `OptimizerConfig` contributes only what frameworks
adjust on it (lr, weight decay). On Megatron-Core >= 0.18 ``ours`` rides on the copy of Megatron's config that our
builder hands `get_megatron_optimizer` (attribute `OURS_ATTRIBUTE`), where our registry entry's ``config_to_kwargs``
reads it.

How it is plugged in, per generation (the narrowest hook each allows):

* Megatron-Core >= 0.18 keeps a registry of emerging optimizers (``megatron/core/optimizer/emerging_optimizers.py``,
  ``_EMERGING_OPTIMIZERS``: name -> optimizer class, state init, config -> kwargs). `register_with_megatron` adds
  each of ours under its registry entry's ``megatron.registered_name`` (``nemo_muon``, ``nemo_soap``,
  ``nemo_normuon``); ``OptimizerConfig(optimizer=<that name>, use_layer_wise_distributed_optimizer=True)`` then goes
  through Megatron's own `get_megatron_optimizer` like its Muon does.
* Megatron-Core 0.16 has no registry: `get_megatron_muon_optimizer` constructs its TensorParallelMuon inline. Here
  `build_layer_wise_016` assembles the same pieces that function assembles (Megatron's param groups and Adam,
  `LayerWiseDistributedOptimizer`) around our optimizer instead.

Megatron's Float16 wrapper swaps each bf16 parameter in the optimizer's groups for its fp32 master copy; our
optimizer knows its parameters by the model's tensors (for names and fused layouts), so `finish_wrapping` moves
that knowledge to the master copies once the optimizer is built, and gives each wrapper of ours the checkpointing of
state of any shape (`nemo_muon.megatron.state_checkpoint`: SOAP's factors, NorMuon's moments).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from nemo_muon.config.optimizer import OptimizerConfig
from nemo_muon.megatron.nonfinite import apply_nonfinite_policy
from nemo_muon.megatron.state_checkpoint import adopt_wrapper, guard_layer_wise_file
from nemo_muon.optim.muon import Muon
from nemo_muon.optim.routed import RoutedOptimizer
from nemo_muon.optim.routing import MATRIX, QKVLayout
from nemo_muon.registry import OptimizerSpec, check_split_target, resolve, spec_for, specs

OURS_ATTRIBUTE = "nemo_muon_config"
"""The attribute of (our copy of) Megatron's `OptimizerConfig` that carries the recipe's validated config to our
registry entries' ``config_to_kwargs`` (Megatron-Core >= 0.18)."""
COLLECTIVES_016 = ("reduce_scatter", "all_reduce")
"""How gradients and parameters travel on Megatron-Core 0.16 / 0.17 (`build_layer_wise_016`): reduced to their owners
and gathered in the next forward, or Megatron's legacy all-reduce and end-of-step all-gather."""
OWNERSHIPS = ("ns_cost", "megatron")
"""Who owns which matrix on Megatron-Core 0.16 (`build_layer_wise_016`): LPT on the update cost, or Megatron's own."""


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


def fused_layouts(model_config: Any, tp_size: int) -> dict[str, Any]:
    """The fused weights of a Megatron model config: ``linear_qkv`` per query group (GQA), split into Q, K, V."""
    heads, groups = model_config.num_attention_heads, model_config.num_query_groups or model_config.num_attention_heads
    if heads % tp_size or groups % tp_size:
        raise ValueError(f"num_attention_heads={heads} and num_query_groups={groups} must be multiples of the tensor-"
                         f"parallel size {tp_size}")
    return {"linear_qkv": QKVLayout(heads // tp_size, groups // tp_size, model_config.kv_channels)}


def _tp(pg_collection: Any) -> tuple[Any, int]:
    tp_group = getattr(pg_collection, "tp", None)
    return tp_group, 1 if tp_group is None else torch.distributed.get_world_size(tp_group)


def engine_kwargs(ours: OptimizerConfig, config: Any, model_chunks: list[Any], pg_collection: Any) -> dict[str, Any]:
    """Keyword arguments of ``engine_class_of(spec_for(ours))``: the fields of our validated config (stated once),
    lr and weight decay from Megatron's config (frameworks and Megatron's scheduler adjust them there), the model's
    names and layouts, and the TP group. The matrix optimizer raises on a non-finite gradient: the step-level policy
    (`nemo_muon.megatron.nonfinite`) decides first, on every rank alike."""
    spec = spec_for(ours)
    tp_group, tp_size = _tp(pg_collection)
    expt_tp = getattr(pg_collection, "expt_tp", None)
    if expt_tp is not None and torch.distributed.get_world_size(expt_tp) != tp_size:
        raise ValueError(f"expert tensor parallelism ({torch.distributed.get_world_size(expt_tp)}) must equal tensor "
                         f"parallelism ({tp_size}) for engine 'nemo_muon' (one TP group for all matrices)")
    kwargs = {**ours.optimizer_kwargs(), "lr": config.lr, "weight_decay": config.weight_decay, "nonfinite": "raise",
              "tp_group": tp_group if tp_size > 1 else None, "param_names": parameter_names(model_chunks)}
    if "fused_layouts" in spec.runtime_args:
        kwargs["fused_layouts"] = fused_layouts(model_chunks[0].config, tp_size)
    return kwargs


def _kwargs_from_attached(config: Any, model_chunks: list[Any], pg_collection: Any) -> dict[str, Any]:
    """Megatron's ``config_to_kwargs`` of our registry entries: the config our builder attached (`OURS_ATTRIBUTE`)."""
    ours = getattr(config, OURS_ATTRIBUTE, None)
    if ours is None:
        raise ValueError(f"OptimizerConfig(optimizer={config.optimizer!r}) is nemo-muon's; build it through "
                         "nemo_muon.megatron.build.build_engine (or Bridge's OptimizerConfig.provide() of "
                         "nemo_muon.megatron.bridge_provider), which carries the recipe's optimizer config")
    return engine_kwargs(ours, config, model_chunks, pg_collection)


def finish_wrapping(optimizer: Any) -> int:
    """After Megatron wrapped our optimizer in `Float16OptimizerWithFloat16Params` (or `FP32Optimizer`): move routes to
    the master copies, switch the wrapper to checkpointing our state of any shape, and the layer-wise optimizer to
    writing its torch-format file only inside a checkpoint folder (`state_checkpoint`).

    Walks the (chained / layer-wise) Megatron optimizer; returns how many of ours were found (0 = none).
    """
    found = 0
    if hasattr(optimizer, "save_state_dict_to_file"):  # Megatron's layer-wise optimizer
        guard_layer_wise_file(optimizer)
    for sub in getattr(optimizer, "chained_optimizers", [optimizer]):
        if sub is not optimizer and hasattr(sub, "chained_optimizers"):
            found += finish_wrapping(sub)
            continue
        raw = getattr(sub, "optimizer", None)
        if not isinstance(raw, _OnMegatronParams):
            continue
        found += 1
        for old_group, new_group in zip(getattr(sub, "float16_groups", []),
                                        getattr(sub, "fp32_from_float16_groups", []), strict=True):
            raw.rekey(zip(old_group, new_group, strict=True))
        adopt_wrapper(sub)
    return found


def register_with_megatron() -> None:
    """Add every registry entry with engine 'nemo_muon' to Megatron-Core's emerging-optimizer registry (>= 0.18)
    under its ``megatron.registered_name``; idempotent."""
    from megatron.core.optimizer import emerging_optimizers as eo

    registry = getattr(eo, "_EMERGING_OPTIMIZERS", None)
    entry_cls = getattr(eo, "EmergingOptimizerEntry", None)
    if registry is None or entry_cls is None:
        raise RuntimeError("megatron.core.optimizer.emerging_optimizers has no _EMERGING_OPTIMIZERS / "
                           "EmergingOptimizerEntry: the registration hook moved (written for Megatron-Core 0.19)")
    for spec in specs():
        if "nemo_muon" in spec.megatron.engines and spec.megatron.registered_name:
            registry.setdefault(spec.megatron.registered_name, entry_cls(
                optimizer_cls=engine_class_of(spec), init_state_fn=init_placeholder_state,
                config_to_kwargs=_kwargs_from_attached))


def build_layer_wise_016(config: Any, model_chunks: list[Any], pg_collection: Any, config_overrides: Any = None, *,
                         ours: OptimizerConfig, ownership: str = "ns_cost",
                         collectives: str = "reduce_scatter") -> Any:
    """Megatron-Core 0.16: our Muon for the 2-D non-embedding weights, Megatron's Adam for the rest, both inside
    Megatron's `LayerWiseDistributedOptimizer` (the assembly `get_megatron_muon_optimizer` does, with our class).
    ``config_overrides``: Megatron's per-parameter overrides (Bridge's weight-decay rules), applied to both parts.
    ``ours``: the recipe's validated optimizer config; its registry entry names the class, its fields are the
    keyword arguments (`engine_kwargs`). ``ownership``: 'ns_cost' (LPT on the update cost,
    `nemo_muon.megatron.cost_balanced`) or 'megatron' (Megatron's numel ping-pong, for comparison).
    ``collectives``: 'reduce_scatter' (gradients reduced to their owners, `owner_reduce`; parameters all-gathered in
    the next forward, `owner_gather`) or 'all_reduce' (Megatron's legacy wiring: DDP all-reduces, the step
    all-gathers); the DDP chunks must not use the distributed optimizer (no layout exists before 0.18)."""
    from megatron.core.optimizer import _get_param_groups, get_megatron_optimizer
    from megatron.core.optimizer.layer_wise_optimizer import LayerWiseDistributedOptimizer

    from nemo_muon.megatron.cost_balanced import ns_balanced_class

    if config.use_distributed_optimizer or config.fp16:
        raise ValueError("the layer-wise optimizer needs use_distributed_optimizer=False and fp16=False; got "
                         f"use_distributed_optimizer={config.use_distributed_optimizer}, fp16={config.fp16}")
    if collectives not in COLLECTIVES_016:
        raise ValueError(f"collectives must be one of {COLLECTIVES_016}; got {collectives!r}")
    matrices, others = [], []
    for chunk in model_chunks:
        for _, p in chunk.named_parameters():
            if not p.requires_grad:
                continue
            is_matrix = p.dim() == 2 and not getattr(p, "is_embedding_or_output_parameter", False)
            (matrices if is_matrix else others).append(p)
    adam_config = copy.copy(config)
    adam_config.optimizer, adam_config.bf16 = "adam", False  # the layer-wise wrapper adds the bf16 master weights
    try:  # Megatron's param groups and Adam see only the trainable params: split by requires_grad, then restore
        for p in others:
            p.requires_grad_(False)
        groups = _get_param_groups(model_chunks, adam_config, config_overrides)
        matrix_opt = engine_class_of(spec_for(ours))(groups, **engine_kwargs(ours, config, model_chunks,
                                                                               pg_collection))
        for p in others:
            p.requires_grad_(True)
        for p in matrices:
            p.requires_grad_(False)
        adam = get_megatron_optimizer(adam_config, model_chunks, config_overrides=config_overrides,
                                      use_gloo_process_groups=False)
    finally:
        for p in (*matrices, *others):
            p.requires_grad_(True)
    optimizers = [matrix_opt, *adam.chained_optimizers]
    init_fns = [init_placeholder_state] + [_init_adam_state] * len(adam.chained_optimizers)
    if ownership not in OWNERSHIPS:
        raise ValueError(f"ownership must be one of {OWNERSHIPS}; got {ownership!r}")
    target = getattr(ours, "ns_split_target", None)
    if ownership == "ns_cost":
        layer_wise = ns_balanced_class()(optimizers, config, pg_collection, init_state_fn_list=init_fns,
                                         split_target=target)
    elif target is not None:
        raise ValueError(f"ns_split_target needs ownership='ns_cost' (the split is planned with it); got "
                         f"ownership={ownership!r}, ns_split_target={target!r}")
    else:
        layer_wise = LayerWiseDistributedOptimizer(optimizers, config, pg_collection, init_state_fn_list=init_fns)
    finish_wrapping(layer_wise)
    apply_nonfinite_policy(layer_wise, nonfinite_policy(ours))
    if collectives == "reduce_scatter":
        _reduce_scatter_016(layer_wise, model_chunks, pg_collection)
    return layer_wise


def _reduce_scatter_016(layer_wise: Any, model_chunks: list[Any], pg_collection: Any) -> None:
    """Gradients reduced to their owners and parameters gathered in the next forward, on DDP-wrapped chunks
    without the distributed optimizer (`owner_reduce`, `owner_gather`); nothing at data-parallel size 1."""
    from nemo_muon.megatron.owner_gather import gather_in_forward
    from nemo_muon.megatron.owner_reduce import reduce_to_owners

    if layer_wise.dp_cp_params_list is None:
        return
    for chunk in model_chunks:
        ddp_config = getattr(chunk, "ddp_config", None)
        if ddp_config is None or not hasattr(chunk, "bucket_groups"):
            raise TypeError(f"collectives='reduce_scatter' needs DDP-wrapped model chunks; got {type(chunk).__name__}")
        if ddp_config.use_distributed_optimizer:
            raise ValueError("the layer-wise optimizer on Megatron-Core 0.16 / 0.17 needs DDP with "
                             "use_distributed_optimizer=False; got True")
    reduce_to_owners(layer_wise, model_chunks, pg_collection)
    gather_in_forward(layer_wise, model_chunks, pg_collection)


def _init_adam_state(opt: torch.optim.Optimizer, config: Any = None) -> None:
    """torch Adam's state before a checkpoint load (what Megatron-Core 0.16's Muon path does for its Adam part)."""
    for group in opt.param_groups:
        for p in group["params"]:
            if len(opt.state[p]) == 0:
                opt.state[p]["exp_avg"] = torch.zeros_like(p.data)
                opt.state[p]["exp_avg_sq"] = torch.zeros_like(p.data)


def build_layer_wise_018(config: Any, model_chunks: list[Any], pg_collection: Any, *, ours: OptimizerConfig,
                         config_overrides: Any = None) -> Any:
    """Megatron-Core >= 0.18: Megatron's own builder with ``optimizer=<our registry entry's registered_name>``
    (registered here), ``ours`` attached to the copy of Megatron's config it is given (`OURS_ATTRIBUTE`).
    ``config_overrides``: Megatron's per-parameter overrides (Bridge's weight-decay rules), passed to Megatron's
    builder. ``ours.ns_split_target``'s block shares are attached by the caller (`nemo_muon.megatron.build.
    build_engine`, `nemo_muon.megatron.split_shares`)."""
    from megatron.core.optimizer import get_megatron_optimizer

    check_split_target(ours)
    register_with_megatron()
    config = copy.copy(config)
    config.optimizer = spec_for(ours).megatron.registered_name
    setattr(config, OURS_ATTRIBUTE, ours)
    optimizer = get_megatron_optimizer(config, model_chunks, config_overrides=config_overrides,
                                       pg_collection=pg_collection, use_gloo_process_groups=False)
    if not finish_wrapping(optimizer):
        raise RuntimeError(f"Megatron-Core built none of our optimizers for optimizer={config.optimizer!r}")
    return apply_nonfinite_policy(optimizer, nonfinite_policy(ours))


def nonfinite_policy(ours: OptimizerConfig) -> str:
    """The step-level non-finite policy of our config (`nemo_muon.megatron.nonfinite`). Our matrix optimizer itself
    keeps ``nonfinite='raise'``: the step-level policy decides first, on every rank alike."""
    return getattr(ours, "nonfinite", "raise")
