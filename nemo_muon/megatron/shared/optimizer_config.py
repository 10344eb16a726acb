"""Our `MuonConfig` / `SoapConfig` / `AdamWConfig` -> `megatron.core.optimizer.OptimizerConfig`.

Two Megatron-Core API generations are supported (`nemo_muon.megatron.generations`), told apart by the fields of the
installed `OptimizerConfig`:

* ``core_016_017`` (Megatron-Core 0.16 / 0.17, NGC 26.02 / 26.04): Muon through `megatron.core.optimizer.muon.get_megatron_muon_optimizer(...,
  layer_wise_distributed_optimizer=...)`, which Megatron-Bridge selects by the name ``"dist_muon"`` (layer-wise) or
  ``"muon"``; field ``muon_use_nesterov`` (default False!); no coefficient-set field; no SOAP.
* ``core_018_plus``: ``optimizer="muon"|"soap"`` + ``use_layer_wise_distributed_optimizer`` through
  `get_megatron_optimizer`; fields ``muon_nesterov``, ``muon_coefficient_type``, ``soap_*``.

The known traps are fixed here, never silently: momentum (0.95) and Nesterov are always written explicitly (the
CLI default is 0.9, the 0.16 field default for Nesterov is False); the TP mode is always explicit (Megatron's default
is blockwise, which makes updates depend on the TP size; ours is duplicated); weight decay is passed as set; a
setting the installed version cannot honour raises a ValueError naming the field (SOAP's
``precondition_frequency`` other than 1 where SOAP refreshes every step, split gate/up, a separate AdamW lr, ...).
The mapping itself (`megatron_optimizer_spec`) is pure and takes the field names, so it is tested against the real
`OptimizerConfig` of each version.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from nemo_muon._validation import check_choice
from nemo_muon.config.optimizer import BaseOptimizerConfig, MuonConfig, SoapConfig
from nemo_muon.megatron.generations import CORE_016_017, CORE_018_PLUS, core_generation
from nemo_muon.registry import resolve, spec_for, spec_named

NS_PRECISION_TO_MCORE: dict[str, str] = {"fp32": "highest", "bf16": "medium"}
"""`muon_fp32_matmul_prec` (torch.set_float32_matmul_precision inside NS): highest = fp32, medium = bf16."""
MCORE_TP_MODES: tuple[str, ...] = ("duplicated", "distributed", "blockwise")
MCORE_SCALE_MODES: tuple[str, ...] = ("spectral", "shape_scaling", "unit_rms_norm")
MATCH_RMS_ADAMW_FACTOR = 0.2
"""match_rms_adamw = spectral sqrt(max(m, n)) x 0.2: mapped to spectral with extra_scale_factor x 0.2 (exact)."""
SOAP_FIXED_EPS = 1e-8
"""Megatron-Core passes no eps to emerging_optimizers.soap.SOAP, so its default (1e-8) is the only honoured value."""
ENGINE_NEMO_MUON = "nemo_muon"
"""The value of ``optimizer.engine`` that runs our matrix update inside Megatron (the other: 'megatron')."""
BUILDER_NEMO_MUON = "nemo_muon"
"""`MegatronOptimizerSpec.builder` of engine 'nemo_muon': `nemo_muon.megatron.shared.engine` (our Muon inside
Megatron's layer-wise optimizer); the others name Megatron-Core's own builder functions."""
LEGACY_COEFFICIENTS = "quintic"
"""0.16's TensorParallelMuon always uses the quintic coefficient schedule (no config field): Megatron's own Muon there
takes no other set; engine 'nemo_muon' runs any (its config records what Megatron can say)."""
MEGATRON_MUON_DEFAULTS: dict[str, Any] = dict(spec_named("muon").megatron.recipe_defaults)
"""The MuonConfig values Megatron-Core can honour where our defaults differ (Muon's registry entry, which the mapping
refuses otherwise): fused gate/up (linear_fc1) orthogonalized as one matrix; non-finite grads raise (no skip-step)."""


@dataclass(frozen=True)
class MegatronOptimizerSpec:
    """How to build the optimizer with the installed Megatron-Core."""

    api: str
    """The Megatron-Core generation whose `OptimizerConfig` fields were written (`nemo_muon.megatron.generations`)."""
    kwargs: dict[str, Any]
    """Keyword arguments of megatron.core.optimizer.OptimizerConfig."""
    builder: str
    """'get_megatron_optimizer', 'get_megatron_muon_optimizer' (0.16 Muon) or 'nemo_muon' (our Muon inside Megatron's
    layer-wise optimizer, `nemo_muon.megatron.shared.engine`)."""
    layer_wise: bool
    """Whole matrices per DP rank (LayerWiseDistributedOptimizer)."""
    bridge_optimizer: str
    """The name Megatron-Bridge's setup_optimizer dispatches on ('dist_muon', 'muon', 'soap', 'adam')."""


def api_for_fields(fields: Collection[str]) -> str:
    """The API generation of an OptimizerConfig with these field names."""
    if "use_layer_wise_distributed_optimizer" in fields:
        return CORE_018_PLUS
    if "muon_momentum" in fields:
        return CORE_016_017
    raise ValueError("megatron-core must be >= 0.16 (OptimizerConfig has no muon_* fields); got an older version")


API_FIELDS: dict[str, frozenset[str]] = {
    CORE_016_017: frozenset({"muon_momentum"}),
    CORE_018_PLUS: frozenset({"muon_momentum", "use_layer_wise_distributed_optimizer", "muon_coefficient_type"}),
}
"""The field names that tell the API generations apart: enough for `megatron_optimizer_spec` to refuse what a
generation cannot honour before launch, where Megatron-Core is not installed (the kwargs it returns are partial)."""


def api_for_version(version: str) -> str:
    """The API generation of a Megatron-Core version string ('0.17.1' -> 'core_016_017', '0.19.2' ->
    'core_018_plus')."""
    return core_generation(version).name


def _refuse(field: str, value: Any, why: str) -> ValueError:
    return ValueError(f"{field}={value!r} cannot be honoured by Megatron-Core: {why}")


def _common(opt: BaseOptimizerConfig, *, grad_clip: float, min_lr: float | None, bf16: bool) -> dict[str, Any]:
    # AdamWConfig has no policy field; engine 'nemo_muon' skips globally (`nemo_muon.megatron.shared.nonfinite`)
    if getattr(opt, "nonfinite", "raise") != "raise" and getattr(opt, "engine", None) != ENGINE_NEMO_MUON:
        raise _refuse(f"{opt.name}.nonfinite", opt.nonfinite,
                      "it has no skip-step for bf16 without a loss scaler; set nonfinite='raise' (Megatron's "
                      "check_for_nan_in_grad), or optimizer.engine='nemo_muon', which skips the step on every rank")
    kw: dict[str, Any] = {"lr": opt.lr, "weight_decay": opt.weight_decay, "clip_grad": grad_clip, "bf16": bf16}
    if min_lr is not None:
        kw["min_lr"] = min_lr
    return kw


def _megatron_structure(opt: BaseOptimizerConfig) -> None:
    """What Megatron's structure refuses whichever engine updates the matrices (field-based: any Muon-family config)."""
    if getattr(opt, "split_gate_up", False):
        raise _refuse(f"{opt.name}.split_gate_up", True, "it orthogonalizes linear_fc1 (gate and up fused) as one "
                      "matrix; set optimizer.split_gate_up=false for the megatron backend")
    if getattr(opt, "adamw_lr", None) is not None:
        raise _refuse(f"{opt.name}.adamw_lr", opt.adamw_lr, "its Adam part uses the matrix optimizer's lr; set "
                      "optimizer.adamw_lr=none")


def muon_fields(opt: MuonConfig, api: str, fields: Collection[str], *, engine: str, **_: Any) -> dict[str, Any]:
    """Muon's (and its variants' Muon part's) Megatron-Core fields (the registry entry's ``megatron.fields``).
    Written for either engine, so the config Megatron validates and logs says what runs; engine 'nemo_muon' reads
    none of them back. A setting no field can say is refused on both engines."""
    check_choice("muon.tp_mode (Megatron-Core)", opt.tp_mode, MCORE_TP_MODES)
    scale_mode, extra = opt.scale_mode, opt.extra_scale_factor
    if scale_mode == "match_rms_adamw":
        scale_mode, extra = "spectral", extra * MATCH_RMS_ADAMW_FACTOR
    check_choice("muon.scale_mode (Megatron-Core)", scale_mode, MCORE_SCALE_MODES)
    kw: dict[str, Any] = {
        "muon_momentum": opt.momentum,
        "muon_num_ns_steps": opt.ns_steps,
        "muon_scale_mode": scale_mode,
        "muon_extra_scale_factor": extra,
        "muon_fp32_matmul_prec": NS_PRECISION_TO_MCORE[opt.ns_precision],
        "muon_tp_mode": opt.tp_mode,
        "muon_split_qkv": opt.split_qkv,
    }
    if api == CORE_018_PLUS:
        kw["muon_nesterov"] = opt.nesterov
        kw["muon_scalar_optimizer"] = "adam"
    else:
        kw["muon_use_nesterov"] = opt.nesterov
    if "muon_coefficient_type" in fields:  # 0.17 has the field already; 0.16 does not
        kw["muon_coefficient_type"] = opt.coefficients
    elif opt.coefficients != LEGACY_COEFFICIENTS and engine != ENGINE_NEMO_MUON:
        raise _refuse("muon.coefficients", opt.coefficients,
                      f"megatron-core 0.16's own Muon always uses {LEGACY_COEFFICIENTS!r} (no coefficient field); "
                      "engine 'nemo_muon' runs every set (optimizer.engine=nemo_muon)")
    return kw


def soap_fields(opt: SoapConfig, api: str, fields: Collection[str], *, engine: str,
                soap_has_precondition_frequency: bool = False, **_: Any) -> dict[str, Any]:
    """SOAP's Megatron-Core fields (>= 0.18; 0.16 has none). Engine 'nemo_muon' honours every field (written for the
    log, read back never); engine 'megatron' (emerging-optimizers' SOAP) refuses what it ignores."""
    if engine == ENGINE_NEMO_MUON:
        if api != CORE_018_PLUS:
            return {}
        return {"soap_shampoo_beta": opt.shampoo_beta, "soap_precondition_frequency": opt.precondition_frequency}
    if api != CORE_018_PLUS:
        raise _refuse("optimizer", opt.name, "megatron-core 0.16 has Muon only; SOAP needs megatron-core >= 0.18")
    if opt.precondition_frequency != 1 and not soap_has_precondition_frequency:
        raise _refuse("soap.precondition_frequency", opt.precondition_frequency,
                      "the installed emerging_optimizers SOAP refreshes its eigenbasis every step and ignores "
                      "soap_precondition_frequency; use 1")
    if opt.eps != SOAP_FIXED_EPS:
        raise _refuse("soap.eps", opt.eps, f"it passes no eps to SOAP, whose default is {SOAP_FIXED_EPS}")
    return {"soap_shampoo_beta": opt.shampoo_beta, "soap_precondition_frequency": opt.precondition_frequency}


def megatron_optimizer_spec(
    opt: BaseOptimizerConfig,
    *,
    fields: Collection[str],
    grad_clip: float = 1.0,
    min_lr: float | None = None,
    layerwise: bool = True,
    bf16: bool = True,
    soap_has_precondition_frequency: bool = False,
) -> MegatronOptimizerSpec:
    """Map ``opt`` onto an OptimizerConfig with the given field names (pure; raises on what cannot be honoured).

    The optimizer's registry entry decides: an element-wise one (AdamW) is Megatron's distributed (ZeRO-1)
    optimizer, as Bridge's recipes use it (``layerwise`` is a matrix-optimizer setting); a matrix optimizer's fields
    are written by its entry's ``megatron.fields`` mapping, so the config Megatron validates and logs describes what
    runs. With engine 'nemo_muon' ours runs inside Megatron's layer-wise optimizer, built from our config itself
    (`nemo_muon.megatron.shared.build.build_engine`): Megatron's copy is never read back.
    """
    spec = spec_for(opt)
    api = api_for_fields(fields)
    kw = _common(opt, grad_clip=grad_clip, min_lr=min_lr, bf16=bf16)
    (beta1, beta2), eps = spec.megatron.adam_part(opt)
    kw.update(adam_beta1=beta1, adam_beta2=beta2, adam_eps=eps)
    if "decoupled_weight_decay" in fields:
        kw["decoupled_weight_decay"] = True
    name = spec.megatron.bridge_name
    if spec.matrix is None:
        kw.update(optimizer=name, use_distributed_optimizer=True)
        return MegatronOptimizerSpec(api, kw, "get_megatron_optimizer", False, name)
    engine = opt.engine
    if engine not in spec.megatron.engines:
        raise _refuse(f"{opt.name}.engine", engine, f"{spec.label} runs inside Megatron-Core with engine "
                      f"{' or '.join(map(repr, spec.megatron.engines))} only")
    _megatron_structure(opt)
    kw.update(resolve(spec.megatron.fields)(opt, api, fields, engine=engine,
                                            soap_has_precondition_frequency=soap_has_precondition_frequency))
    layer_wise_name = spec.megatron.bridge_layer_wise_name or name
    if engine == ENGINE_NEMO_MUON:
        if not layerwise:
            raise _refuse(f"{opt.name}.engine", engine, f"nemo-muon's {spec.label} runs inside Megatron's layer-wise "
                          "distributed optimizer; keep layerwise on, or set optimizer.engine=megatron")
        if api == CORE_016_017:  # Bridge 0.3 sends dist_muon and any *soap* name to the (hooked) Muon builder
            kw.update(optimizer=f"dist_{name}", use_distributed_optimizer=False)
            return MegatronOptimizerSpec(api, kw, BUILDER_NEMO_MUON, True, f"dist_{name}")
        kw.update(optimizer=name, use_distributed_optimizer=False, use_layer_wise_distributed_optimizer=True)
        return MegatronOptimizerSpec(api, kw, BUILDER_NEMO_MUON, True, layer_wise_name)
    if api == CORE_016_017:
        kw.update(optimizer=f"dist_{name}" if layerwise else name, use_distributed_optimizer=False)
        return MegatronOptimizerSpec(api, kw, "get_megatron_muon_optimizer", layerwise, kw["optimizer"])
    kw.update(optimizer=name, use_distributed_optimizer=False, use_layer_wise_distributed_optimizer=layerwise)
    return MegatronOptimizerSpec(api, kw, "get_megatron_optimizer", layerwise, layer_wise_name if layerwise else name)


def ddp_flags(opt: BaseOptimizerConfig, *, cost_layout: bool = False) -> dict[str, bool]:
    """The `DistributedDataParallelConfig` fields the optimizer decides, on every megatron path.

    AdamW shards its state (ZeRO-1, Megatron's distributed optimizer); Muon/SOAP own whole matrices (the layer-wise
    optimizer: on the legacy path without ``use_distributed_optimizer``; with ``cost_layout``, where DDP is built on
    the parameter layout owned by update cost (`nemo_muon.megatron.core_018_plus.cost_layout`, `nemo_muon.megatron.bridge_05_06.layout`),
    with it: gradients reduce-scattered to their owners, parameters all-gathered). DDP's NaN check (each rank's local
    gradients, before the reduction; fatal, on that rank alone) is on for ``nonfinite='raise'``, the only policy
    Megatron's own optimizers accept (`megatron_optimizer_spec`), and off for engine 'nemo_muon' with
    ``nonfinite='skip'``: there the global gradient norm decides on every rank (`nemo_muon.megatron.shared.nonfinite`),
    which the local check would pre-empt by raising on the one rank that saw the NaN.
    """
    skip = getattr(opt, "nonfinite", "raise") == "skip" and getattr(opt, "engine", None) == ENGINE_NEMO_MUON
    return {"use_distributed_optimizer": spec_for(opt).matrix is None or cost_layout, "check_for_nan_in_grad": not skip}


def soap_accepts_precondition_frequency() -> bool:
    """Whether the installed emerging_optimizers SOAP takes a precondition_frequency (0.3.0 does not)."""
    from emerging_optimizers.soap import SOAP

    return "precondition_frequency" in inspect.signature(SOAP.__init__).parameters


def to_megatron_optimizer_config(
    opt: BaseOptimizerConfig,
    *,
    grad_clip: float = 1.0,
    min_lr: float | None = None,
    layerwise: bool = True,
    bf16: bool = True,
) -> tuple[Any, MegatronOptimizerSpec]:
    """A real `megatron.core.optimizer.OptimizerConfig` of the installed Megatron-Core, and how to build it."""
    from megatron.core.optimizer import OptimizerConfig as MCoreOptimizerConfig

    fields = {f.name for f in dataclasses.fields(MCoreOptimizerConfig)}
    soap_pf = getattr(opt, "engine", None) == "megatron" and soap_accepts_precondition_frequency()
    spec = megatron_optimizer_spec(opt, fields=fields, grad_clip=grad_clip, min_lr=min_lr, layerwise=layerwise,
                                   bf16=bf16, soap_has_precondition_frequency=soap_pf)
    return MCoreOptimizerConfig(**spec.kwargs), spec

