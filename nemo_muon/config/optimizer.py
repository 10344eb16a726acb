"""Optimizer configs: the single place where optimizer defaults live.

Field names equal the keyword arguments of `nemo_muon.Muon` / `nemo_muon.SOAP` / `torch.optim.AdamW`, so
`optimizer_kwargs()` is a plain copy; the Megatron-Core mapping lives in `nemo_muon.megatron`. Which optimizer a
config is, and everything else the house needs to know of it, is its entry in `nemo_muon.registry`; an optimizer
added later keeps its config in its registry file (e.g. ``nemo_muon/registry/normuon.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from nemo_muon._validation import check_choice, check_positive_int, check_range, fail, validate_once

CoefficientSet = Literal["simple", "quintic", "polar_express", "cans", "aol", "deepseekv4"]
ScaleMode = Literal["spectral", "shape_scaling", "unit_rms_norm", "match_rms_adamw"]
TPMode = Literal["duplicated", "distributed", "blockwise", "auto"]
NSPrecision = Literal["fp32", "bf16"]
NonFinitePolicy = Literal["skip", "raise"]
MegatronEngine = Literal["nemo_muon", "megatron"]
MegatronCollectives = Literal["all_reduce", "reduce_scatter"]

COEFFICIENT_SETS: tuple[str, ...] = ("simple", "quintic", "polar_express", "cans", "aol", "deepseekv4")
"""emerging-optimizers' Newton–Schulz coefficient sets, in its order (tests/test_coefficient_sets.py checks the list
against the installed package; tables, sources and schedules: nemo_muon/optim/coefficients.py)."""
REVERSED_PAST_TABLE: dict[str, int] = {"aol": 4}
"""Cycling coefficient sets whose first step maps an orthogonalized direction (singular value 1) to a negative value,
with the steps their table defines. Past the table the cycle starts it again on the orthogonalized matrix and reverses
the update (aol: a + b + c = -0.585; at ns_steps 5-8 the update of a Gaussian 64x256 matrix has cosine -0.998 with
the 4-step one), so ns_steps is refused past the table. Derived from emerging-optimizers' tables (whose
``newton_schulz`` runs such a schedule as asked) and checked against them by tests/test_coefficient_sets.py."""
SCALE_MODES: tuple[str, ...] = ("spectral", "shape_scaling", "unit_rms_norm", "match_rms_adamw")
TP_MODES: tuple[str, ...] = ("duplicated", "distributed", "blockwise", "auto")
NS_PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
NONFINITE_POLICIES: tuple[str, ...] = ("skip", "raise")
MEGATRON_ENGINES: tuple[str, ...] = ("nemo_muon", "megatron")
MEGATRON_COLLECTIVES: tuple[str, ...] = ("all_reduce", "reduce_scatter")
MEGATRON_BACKEND_ONLY = "megatron_backend_only"
"""Field metadata key: the field chooses how the megatron backend builds the optimizer; no optimizer-class kwarg."""
LAYERWISE_ENGINE_FIELD = "layerwise_engine_field"
"""Field metadata: read by the layer-wise ownership (not an argument of the optimizer class)."""
MAX_NS_STEPS = 100
"""Newton–Schulz iterations at most (5 is standard; each costs three matmuls per matrix per step)."""
DEFAULT_WEIGHT_DECAY = 0.1
"""The one weight-decay default of every optimizer config and optimizer class (Bridge's recipes and torch.optim.Muon
use 0.1; Moonlight found weight decay essential for Muon at scale)."""


def check_ns_schedule(coefficients: str, steps: int, *, steps_field: str = "steps",
                      coefficients_field: str = "coefficients") -> None:
    """Refuse more NS steps than the table of a set of `REVERSED_PAST_TABLE` defines (its cycle would reverse the
    update); the message names both fields."""
    table = REVERSED_PAST_TABLE.get(coefficients)
    if table is not None and steps > table:
        raise fail(steps_field, steps, f"<= {table} with {coefficients_field}={coefficients!r} (its {table}-step "
                                       f"table cycles, and its first step reverses an orthogonalized update: "
                                       f"config.optimizer.REVERSED_PAST_TABLE)")


def _check_betas(field: str, betas: tuple[float, float]) -> None:
    if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
        raise ValueError(f"{field} must be a pair (beta1, beta2) with each in [0, 1); got {betas!r}")
    for i, b in enumerate(betas):
        check_range(f"{field}[{i}]", b, low=0.0, high=1.0, high_inclusive=False)


@dataclass(kw_only=True)
class BaseOptimizerConfig:
    """What every optimizer config has: lr, weight decay, its registry ``name``, validation at construction."""

    lr: float = 3e-4
    """Peak learning rate (the scheduler scales it). 0 is accepted (a frozen phase; Megatron's warm-up starts there);
    negative, NaN and infinite rates are refused."""
    weight_decay: float = DEFAULT_WEIGHT_DECAY
    """Decoupled weight decay, applied as p -= lr * weight_decay * p. Used as given (never pinned by a scheduler)."""

    name: str = dataclasses.field(default="", init=False)

    def __post_init__(self) -> None:
        validate_once(self)

    def validate(self) -> None:
        """Check every field; called at construction and again when a run is built (recipes may mutate)."""
        check_range(f"{self.name}.lr", self.lr, low=0.0)
        check_range(f"{self.name}.weight_decay", self.weight_decay, low=0.0)

    def optimizer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the optimizer class (every field except `name` and the megatron backend's)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.init and not f.metadata.get(MEGATRON_BACKEND_ONLY) and not f.metadata.get(LAYERWISE_ENGINE_FIELD)}


@dataclass(kw_only=True)
class MatrixOptimizerConfig(BaseOptimizerConfig):
    """What every matrix optimizer's config has besides its hyperparameters: the non-finite policy and, on the
    megatron backend, the engine that updates the matrices and how their gradients and parameters travel."""

    nonfinite: NonFinitePolicy = "skip"
    """A non-finite gradient anywhere skips the whole step (and is reported) or raises."""
    engine: MegatronEngine = dataclasses.field(default="nemo_muon", metadata={MEGATRON_BACKEND_ONLY: True})
    """Megatron backend only: whose optimizer updates the matrices inside Megatron-Core's layer-wise distributed
    optimizer: 'nemo_muon' (this package's, on every supported Megatron-Core) or 'megatron' (Megatron-Core's own:
    TensorParallelMuon, or emerging-optimizers' SOAP on 0.18+). The torch backend always runs this package's and
    refuses 'megatron'."""
    collectives: MegatronCollectives = dataclasses.field(default="all_reduce", metadata={MEGATRON_BACKEND_ONLY: True})
    """Megatron backend, engine 'nemo_muon' only: how gradients reach the matrices' owners and the updated
    parameters come back. 'all_reduce' (the default): Megatron's own wiring, nothing of its DDP changed: DDP
    all-reduces every gradient, the layer-wise optimizer all-gathers the updated parameters after the step.
    'reduce_scatter': each gradient reduced to its owner and the parameters all-gathered in the next forward, about
    2/3 of the bytes (Megatron-Core 0.16 / 0.17: DDP's bucket groups switched to our owner reduce and gather;
    >= 0.18: DDP built on our cost layout through Megatron-Bridge 0.5 / 0.6's wrap, which split ownership on 0.18+
    needs). Opt in where a preflight on the allocation passed: these collectives and overrides have run on gloo
    here, not yet on NCCL (docs/operators.md). The torch backend picks its own collectives by cost and refuses
    'reduce_scatter' here."""

    def validate(self) -> None:
        super().validate()
        n = self.name
        check_choice(f"{n}.nonfinite", self.nonfinite, NONFINITE_POLICIES)
        check_choice(f"{n}.engine", self.engine, MEGATRON_ENGINES)
        check_choice(f"{n}.collectives", self.collectives, MEGATRON_COLLECTIVES)
        if self.collectives != "all_reduce" and self.engine != "nemo_muon":
            raise ValueError(f"{n}.collectives must be 'all_reduce' with {n}.engine={self.engine!r} (Megatron's own "
                             f"optimizer runs on Megatron's wiring); got {self.collectives!r}: set "
                             f"optimizer.engine=nemo_muon or optimizer.collectives=all_reduce")


@dataclass(kw_only=True)
class MuonConfig(MatrixOptimizerConfig):
    """Muon for hidden matrices (orthogonalized momentum), AdamW inside the same optimizer for everything else."""

    momentum: float = 0.95
    """EMA momentum of the gradient; 0.95 on every path (Megatron's CLI default 0.9 is a known trap)."""
    nesterov: bool = True
    """Use the Nesterov look-ahead g.lerp(m, momentum) as the NS input."""
    ns_steps: int = 5
    """Newton–Schulz iterations."""
    coefficients: CoefficientSet = "quintic"
    """NS coefficient set (emerging-optimizers' tables; every set runs exactly ns_steps iterations): quintic (5-step
    schedule, cycles; the default), simple (Keller Jordan's one triple), polar_express (8 steps, then its last;
    arXiv 2505.16932), cans (5, then its last; arXiv 2506.10935), aol (Turbo-Muon's 4 without its AOL rescaling;
    ns_steps <= 4: REVERSED_PAST_TABLE), deepseekv4 (DeepSeek-V4's 10: 8 of simple's, then 2 settling steps;
    ns_steps <= 8 is exactly simple). Sources and bands: nemo_muon/optim/coefficients.py, docs/optimizers.md."""
    scale_mode: ScaleMode = "match_rms_adamw"
    """Update scale of an (m, n) matrix: match_rms_adamw 0.2*sqrt(max(m,n)) (the default: the drop-in takes AdamW's
    learning rate and weight decay; chosen by bench/lr_transfer.py, where on two models it lost least of the four at
    AdamW's best lr), spectral sqrt(max(m,n)) (Megatron's default; the megatron recipes set it, through Muon's registry
    entry), shape_scaling sqrt(max(1,m/n)), unit_rms_norm sqrt(m/n)."""
    extra_scale_factor: float = 1.0
    """Multiplies the scale above."""
    ns_precision: NSPrecision = "fp32"
    """Precision of the NS iterations: fp32, or bf16 (GPU speed; looser orthogonality)."""
    tp_mode: TPMode = "duplicated"
    """How NS runs on tensor-parallel shards; duplicated makes updates independent of the TP size."""
    split_qkv: bool = True
    """Orthogonalize Q, K and V of a fused QKV weight separately (per query group layout)."""
    split_gate_up: bool = True
    """Orthogonalize gate and up of a fused gated-MLP weight (linear_fc1 / gate_up_proj) separately."""
    adamw_lr: float | None = None
    """Learning rate of the AdamW part (embeddings, head, 1-D params); None = same as lr."""
    adamw_betas: tuple[float, float] = (0.9, 0.95)
    adamw_eps: float = 1e-8
    ns_split_target: float | None = dataclasses.field(default=None, metadata={LAYERWISE_ENGINE_FIELD: True})
    """Layer-wise ownership: the NS load max/mean over the DP ranks to reach by splitting the largest matrices'
    Newton–Schulz over aligned blocks of 2, 4 or 8 DP ranks (distributed NS within the block; exact up to fp32
    rounding); None = whole-tensor ownership only. Run by the torch backend's whole-tensor optimizer and, on the
    megatron backend, by engine 'nemo_muon' at TP=1: inside Megatron-Core 0.16 / 0.17's layer-wise optimizer, and on
    >= 0.18 in DDP's cost layout (``collectives='reduce_scatter'``, Megatron-Bridge 0.5 / 0.6). The blocks' collectives
    are ours and have not run on NCCL yet: opt in after a preflight. ``nemo-muon plan`` prints the plan this
    executes."""

    name: str = dataclasses.field(default="muon", init=False)

    def validate(self) -> None:
        super().validate()
        n = self.name
        check_range(f"{n}.momentum", self.momentum, low=0.0, high=1.0, high_inclusive=False)
        check_positive_int(f"{n}.ns_steps", self.ns_steps, maximum=MAX_NS_STEPS)
        check_choice(f"{n}.coefficients", self.coefficients, COEFFICIENT_SETS)
        check_ns_schedule(self.coefficients, self.ns_steps, steps_field=f"{n}.ns_steps",
                          coefficients_field=f"{n}.coefficients")
        check_choice(f"{n}.scale_mode", self.scale_mode, SCALE_MODES)
        check_range(f"{n}.extra_scale_factor", self.extra_scale_factor, low=0.0, low_inclusive=False)
        check_choice(f"{n}.ns_precision", self.ns_precision, NS_PRECISIONS)
        check_choice(f"{n}.tp_mode", self.tp_mode, TP_MODES)
        if self.adamw_lr is not None:
            check_range(f"{n}.adamw_lr", self.adamw_lr, low=0.0)
            if self.lr == 0:
                raise ValueError(f"{n}.adamw_lr must be None when {n}.lr is 0 (the AdamW part runs at adamw_lr / lr "
                                 f"times the scheduled rate); got adamw_lr={self.adamw_lr!r}")
        _check_betas(f"{n}.adamw_betas", self.adamw_betas)
        check_range(f"{n}.adamw_eps", self.adamw_eps, low=0.0, low_inclusive=False)
        if self.ns_split_target is not None:
            check_range(f"{n}.ns_split_target", self.ns_split_target, low=1.0)


@dataclass(kw_only=True)
class SoapConfig(MatrixOptimizerConfig):
    """SOAP: Adam in the eigenbasis of Shampoo's Kronecker factors, AdamW for 1-D params and embeddings."""

    betas: tuple[float, float] = (0.9, 0.95)
    shampoo_beta: float = 0.95
    """EMA of the Kronecker factors L = G G^T and R = G^T G."""
    eps: float = 1e-8
    precondition_frequency: int = 1
    """Refresh the eigenbasis every this many steps (honoured; Megatron-Core silently ignores it)."""

    name: str = dataclasses.field(default="soap", init=False)

    def validate(self) -> None:
        super().validate()
        _check_betas("soap.betas", self.betas)
        check_range("soap.shampoo_beta", self.shampoo_beta, low=0.0, high=1.0, high_inclusive=False)
        check_range("soap.eps", self.eps, low=0.0, low_inclusive=False)
        check_positive_int("soap.precondition_frequency", self.precondition_frequency)


@dataclass(kw_only=True)
class AdamWConfig(BaseOptimizerConfig):
    """The AdamW baseline (torch.optim.AdamW semantics)."""

    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8

    name: str = dataclasses.field(default="adamw", init=False)

    def validate(self) -> None:
        super().validate()
        _check_betas("adamw.betas", self.betas)
        check_range("adamw.eps", self.eps, low=0.0, low_inclusive=False)
