"""`TrainingRecipe`: one plain, validated dataclass tree per run, for both backends.

A recipe can be built, printed, planned and launched anywhere (no torch, Bridge or GPU needed); the Megatron
backend turns it into a Megatron-Bridge `ConfigContainer` inside the container, the torch backend trains it with
HF `transformers` models and nemo_muon's optimizers. Sections validate at construction; `TrainingRecipe.validate()`
runs them all again once a recipe has been mutated (overrides) and is built into a run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from nemo_muon._validation import check_choice, check_positive_int, check_range, shown, validate_once
from nemo_muon.config.limits import (
    CPU_COLLECTIVE_TIMEOUT_S,
    GPU_COLLECTIVE_TIMEOUT_S,
    GPUS_PER_NODE,
    MAX_COLLECTIVE_TIMEOUT_S,
    MAX_CPU_PROCESSES_PER_NODE,
    MAX_SEED,
    MAX_STEPS,
    MAX_WORLD_SIZE,
    check_mount_safe_path,
    check_run_name,
)
from nemo_muon.config.optimizer import BaseOptimizerConfig, MuonConfig
from nemo_muon.models.specs import ModelSpec

GPUS: tuple[str, ...] = ("gb300", "gb200", "b200", "h200", "h100", "cpu")
SCHEDULERS: tuple[str, ...] = ("cosine", "wsd", "constant")
DATA_KINDS: tuple[str, ...] = ("mock", "stdlib_text", "indexed")
PRECISIONS: tuple[str, ...] = ("fp32", "bf16", "fp8_cs", "mxfp8")
TORCH_PRECISIONS: tuple[str, ...] = ("fp32", "bf16")
"""Precisions of the torch backend (HF models under autocast); the others need the megatron backend."""
BACKENDS: tuple[str, ...] = ("megatron", "torch")


@dataclass(kw_only=True)
class ParallelismConfig:
    """Model-parallel degrees; data parallelism is what remains of the world size."""

    tp: int = 1
    """Tensor parallel size."""
    pp: int = 1
    """Pipeline parallel size."""
    vp: int = 1
    """Virtual pipeline stages per pipeline rank (1 = no interleaving)."""
    cp: int = 1
    """Context parallel size."""
    ep: int = 1
    """Expert parallel size (MoE)."""
    etp: int = 1
    """Expert tensor parallel size."""
    sequence_parallel: bool = False
    pipeline_layout: str | None = None
    """Megatron `pipeline_model_parallel_layout` string, e.g. 'Et|(tt|)*30L'; None = layers split evenly over pp*vp
    (the layout itself is checked against the model by nemo_muon.accounting.layout.validate_layout)."""

    def __post_init__(self) -> None:
        validate_once(self)

    def validate(self) -> None:
        for name in ("tp", "pp", "vp", "cp", "ep", "etp"):
            check_positive_int(f"parallelism.{name}", getattr(self, name))
        if self.pipeline_layout is not None and not (isinstance(self.pipeline_layout, str) and self.pipeline_layout):
            raise ValueError(
                f"parallelism.pipeline_layout must be a non-empty layout string or None; got {self.pipeline_layout!r}"
            )

    @property
    def model_parallel_size(self) -> int:
        """Ranks one model replica spans: tp * pp * cp."""
        return self.tp * self.pp * self.cp

    def dp(self, world_size: int) -> int:
        """Data-parallel size for a world size (raises if the world is not a multiple of tp*pp*cp)."""
        mp = self.model_parallel_size
        if world_size % mp:
            raise ValueError(
                f"world size must be a multiple of tp*pp*cp = {self.tp}*{self.pp}*{self.cp} = {mp}; got {world_size}"
            )
        return world_size // mp


@dataclass(kw_only=True)
class SystemConfig:
    """Where the run goes: GPU type and node shape (world size = num_nodes * gpus_per_node)."""

    gpu: str = "gb300"
    """One of GPUS; 'cpu' for the torch backend on a CPU machine (then gpus_per_node counts processes)."""
    num_nodes: int = 1
    gpus_per_node: int = 4
    """At most the GPUs a node of that type has (`limits.GPUS_PER_NODE`); processes per node on gpu='cpu'."""
    collective_timeout_s: float | None = None
    """How long a collective waits for a stalled rank before the job fails (torch.distributed's process-group
    timeout; Megatron-Bridge's dist.distributed_timeout_minutes). None = 300 s on gpu='cpu', 600 s on GPUs."""
    preflight: bool = False
    """`nemo-muon launch` runs `nemo-muon preflight` (the optimizer path on a tiny model of the family, on the
    job's own ranks) as the job's first step, and the training only when it passed; megatron backend and a
    layer-wise matrix optimizer only (`nemo_muon.run_checks`). On by default in the GB300 recipes of those."""

    def __post_init__(self) -> None:
        validate_once(self)

    def validate(self) -> None:
        check_choice("system.gpu", self.gpu, GPUS)
        check_positive_int("system.num_nodes", self.num_nodes, maximum=MAX_WORLD_SIZE)
        per_node = GPUS_PER_NODE.get(self.gpu, MAX_CPU_PROCESSES_PER_NODE)
        if isinstance(self.gpus_per_node, int) and not isinstance(self.gpus_per_node, bool) \
                and self.gpus_per_node > per_node:
            what = f"GPUs per {self.gpu} node" if self.gpu in GPUS_PER_NODE else "processes per node on gpu='cpu'"
            raise ValueError(f"system.gpus_per_node must be <= {per_node} ({what}); got {self.gpus_per_node}")
        check_positive_int("system.gpus_per_node", self.gpus_per_node)
        if self.world_size > MAX_WORLD_SIZE:
            raise ValueError(f"system.num_nodes * system.gpus_per_node must be <= {MAX_WORLD_SIZE} ranks; got "
                             f"{self.num_nodes} * {self.gpus_per_node} = {self.world_size}")
        if not isinstance(self.preflight, bool):
            raise ValueError(f"system.preflight must be true or false; got {shown(self.preflight)}")
        if self.collective_timeout_s is not None:
            check_range("system.collective_timeout_s", self.collective_timeout_s, low=0.0,
                        high=MAX_COLLECTIVE_TIMEOUT_S, low_inclusive=False)

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def collective_timeout(self) -> float:
        """The collective timeout in seconds (``collective_timeout_s``, or the default of the device kind)."""
        if self.collective_timeout_s is not None:
            return float(self.collective_timeout_s)
        return CPU_COLLECTIVE_TIMEOUT_S if self.gpu == "cpu" else GPU_COLLECTIVE_TIMEOUT_S


@dataclass(kw_only=True)
class TrainerConfig:
    """Batching and loop lengths (Megatron conventions: batch sizes in sequences)."""

    max_steps: int = 50
    global_batch_size: int = 4096
    micro_batch_size: int = 1
    seq_length: int = 4096
    grad_clip: float = 1.0
    """Clip the global grad norm to this value; 0 disables clipping."""
    eval_interval: int = 0
    """Validate every this many steps; 0 = only at the end (torch backend) / never (megatron benchmarks)."""
    eval_iters: int = 0
    log_interval: int = 1
    seed: int = 1234
    max_consecutive_skips: int = 10
    """Torch backend: stop with an error (exit code 3) after this many consecutive steps skipped for a non-finite
    gradient (a diverged run); 0 = warn only, never stop."""

    def __post_init__(self) -> None:
        validate_once(self)

    def validate(self) -> None:
        check_positive_int("trainer.max_steps", self.max_steps, maximum=MAX_STEPS)
        check_positive_int("trainer.global_batch_size", self.global_batch_size)
        check_positive_int("trainer.micro_batch_size", self.micro_batch_size)
        check_positive_int("trainer.seq_length", self.seq_length)
        check_range("trainer.grad_clip", self.grad_clip, low=0.0)
        check_positive_int("trainer.eval_interval", self.eval_interval, minimum=0)
        check_positive_int("trainer.eval_iters", self.eval_iters, minimum=0)
        check_positive_int("trainer.log_interval", self.log_interval)
        check_positive_int("trainer.seed", self.seed, minimum=0, maximum=MAX_SEED)
        check_positive_int("trainer.max_consecutive_skips", self.max_consecutive_skips, minimum=0)


@dataclass(kw_only=True)
class SchedulerConfig:
    """Learning-rate schedule: linear warmup, then cosine / warmup-stable-decay / constant."""

    kind: str = "cosine"
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of the peak."""
    wsd_decay_fraction: float = 0.2
    """For kind='wsd': the fraction of max_steps spent in the final decay."""

    def __post_init__(self) -> None:
        validate_once(self)

    def validate(self) -> None:
        check_choice("scheduler.kind", self.kind, SCHEDULERS)
        check_positive_int("scheduler.warmup_steps", self.warmup_steps, minimum=0, maximum=MAX_STEPS)
        check_range("scheduler.min_lr_ratio", self.min_lr_ratio, low=0.0, high=1.0)
        check_range("scheduler.wsd_decay_fraction", self.wsd_decay_fraction, low=0.0, high=1.0)


@dataclass(kw_only=True)
class DataConfig:
    """Training data: mock tokens (benchmarks), the Python stdlib source as text (CPU path), or an indexed dataset."""

    kind: str = "mock"
    path: str | None = None
    """For kind='indexed': the Megatron indexed dataset prefix (PREFIX.bin / PREFIX.idx)."""
    corpus_root: str | None = None
    """For kind='stdlib_text': a folder of .py files to use instead of the running interpreter's standard library
    (small corpora for quick trials and tests)."""
    tokenizer_dir: str | None = None
    """Where the locally trained tokenizer is cached (None = a cache folder under the run root)."""
    val_fraction: float = 0.05
    """Deterministic tail fraction of the corpus held out for validation."""

    def __post_init__(self) -> None:
        validate_once(self)

    def validate(self) -> None:
        check_choice("data.kind", self.kind, DATA_KINDS)
        if self.kind == "indexed" and not self.path:
            raise ValueError("data.path must name a Megatron indexed dataset prefix when data.kind='indexed'; got None")
        if self.corpus_root is not None and self.kind != "stdlib_text":
            raise ValueError(f"data.corpus_root must be None unless data.kind='stdlib_text' (it names a .py corpus); got "
                             f"{self.corpus_root!r} with data.kind={self.kind!r}")
        check_range("data.val_fraction", self.val_fraction, low=0.0, high=0.5, low_inclusive=False)


@dataclass(kw_only=True)
class PrecisionConfig:
    """Numerics: fp32, bf16 mixed, fp8 with current scaling (fp8_cs), MXFP8 (Blackwell)."""

    kind: str = "mxfp8"

    def __post_init__(self) -> None:
        validate_once(self)

    def validate(self) -> None:
        check_choice("precision.kind", self.kind, PRECISIONS)


@dataclass(kw_only=True)
class CheckpointConfig:
    """Checkpoints are written atomically to new folders and never overwrite an earlier one."""

    save_interval: int = 0
    """Save every this many steps; 0 = no checkpoints."""
    dir: str | None = None
    """Checkpoint root (None = <run dir>/checkpoints)."""
    resume: bool = False
    """Resume from the newest verified checkpoint in dir."""
    allow_optimizer_change: bool = False
    """Torch backend: let a resume change optimizer hyper-parameters (optimizer.*, trainer.grad_clip) from the
    checkpoint's; the changes are recorded in metrics.jsonl. False = such a resume is refused."""

    def __post_init__(self) -> None:
        validate_once(self)

    def validate(self) -> None:
        check_positive_int("checkpoint.save_interval", self.save_interval, minimum=0)
        if not isinstance(self.allow_optimizer_change, bool):
            raise ValueError(f"checkpoint.allow_optimizer_change must be true or false; "
                             f"got {self.allow_optimizer_change!r}")


@dataclass(kw_only=True)
class LoggingConfig:
    """Where a run writes its metrics JSONL, logs and reports."""

    root: str = "runs"
    """Runs go to <root>/<run_name>; mounted into containers as <root>:<root>, so `limits.MOUNT_SAFE_PATH`."""
    run_name: str | None = None
    """None = the recipe name; a single folder name (`limits.RUN_NAME`)."""
    tensorboard: bool = False
    """Also write TensorBoard events when the tensorboard package is installed."""

    def __post_init__(self) -> None:
        validate_once(self)

    def validate(self) -> None:
        check_mount_safe_path("logging.root", self.root)
        if self.run_name is not None:
            check_run_name("logging.run_name", self.run_name)


@dataclass(kw_only=True)
class TrainingRecipe:
    """A complete run: model, layout, optimizer, data, loop, precision, checkpoints, logs and environment."""

    name: str
    model: ModelSpec
    optimizer: BaseOptimizerConfig = field(default_factory=MuonConfig)
    parallelism: ParallelismConfig = field(default_factory=ParallelismConfig)
    system: SystemConfig = field(default_factory=SystemConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    backend: str = "megatron"
    """'megatron' (Megatron-Bridge in the NGC container) or 'torch' (HF model + nemo_muon, any device)."""
    layerwise: bool = True
    """Use the layer-wise distributed optimizer (whole matrices per DP rank) for Muon/SOAP."""
    qk_clip: bool = False
    """MuonClip: rescale query/key projections when a head's max attention logit exceeds qk_clip_threshold."""
    qk_clip_threshold: float = 100.0
    qk_clip_alpha: float = 0.5
    env: dict[str, str] = field(default_factory=dict)
    """Environment variables the run needs (NCCL/NVTE/CUDA settings of the Bridge perf recipes), set by launchers."""
    hf_config: str | None = None
    """backend='megatron' on Megatron-Bridge >= 0.4 (NGC 26.04 onwards): a local folder holding the model's Hugging
    Face config.json, from which Bridge builds the model (it reaches no Hub); None elsewhere."""

    def __post_init__(self) -> None:
        validate_once(self)

    def validate(self) -> None:
        """Validate the recipe's own rules, and every section changed since it was validated (recipes and overrides may
        have mutated them)."""
        check_run_name("recipe.name", self.name)  # the default run folder name
        if not isinstance(self.optimizer, BaseOptimizerConfig):  # which one: nemo_muon.registry (run_checks)
            raise ValueError(f"recipe.optimizer must be an optimizer config (nemo_muon.registry lists them); got "
                             f"{type(self.optimizer).__name__}")
        for section in (self.model, self.optimizer, self.parallelism, self.system, self.trainer, self.scheduler,
                        self.data, self.precision, self.checkpoint, self.logging):
            validate_once(section)  # validated where it entered; again only if changed since
        check_choice("recipe.backend", self.backend, BACKENDS)
        if self.backend == "torch" and getattr(self.optimizer, "engine", "nemo_muon") != "nemo_muon":
            raise ValueError(f"optimizer.engine must be 'nemo_muon' with backend='torch' (the torch backend always runs "
                             f"nemo-muon's optimizers); got {self.optimizer.engine!r}: set optimizer.engine=nemo_muon or "
                             "backend=megatron")
        if self.backend == "torch" and getattr(self.optimizer, "collectives", "all_reduce") != "all_reduce":
            raise ValueError(f"optimizer.collectives must be 'all_reduce' with backend='torch' (the megatron backend's "
                             f"wiring; the torch backend's whole-tensor optimizer picks its collectives by cost); got "
                             f"{self.optimizer.collectives!r}: set optimizer.collectives=all_reduce or backend=megatron")
        if self.backend == "megatron" and getattr(self.optimizer, "engine", None) == "nemo_muon" and not self.layerwise:
            raise ValueError("layerwise must be true with optimizer.engine='nemo_muon' (it runs inside Megatron's "
                             "layer-wise distributed optimizer); got layerwise=False: set layerwise=true, or "
                             "optimizer.engine=megatron")
        if self.hf_config is not None and (not isinstance(self.hf_config, str) or not self.hf_config.strip()):
            raise ValueError(f"hf_config must be a folder path (the model's Hugging Face config.json) or None; got "
                             f"{self.hf_config!r}")
        if self.hf_config is not None and self.backend != "megatron":
            raise ValueError(f"hf_config must be None with backend={self.backend!r} (only Megatron-Bridge reads it); got "
                             f"{self.hf_config!r}")
        check_range("recipe.qk_clip_threshold", self.qk_clip_threshold, low=0.0, low_inclusive=False)
        check_range("recipe.qk_clip_alpha", self.qk_clip_alpha, low=0.0, high=1.0)
        for k, v in self.env.items():
            if not isinstance(k, str) or not k or not isinstance(v, str):
                raise ValueError(f"recipe.env must map non-empty names to string values; got {k!r}={v!r}")

    @property
    def world_size(self) -> int:
        return self.system.world_size

    @property
    def dp(self) -> int:
        return self.parallelism.dp(self.world_size)

    def replace(self, **changes: object) -> TrainingRecipe:
        """A copy with some top-level sections replaced (validated again)."""
        return dataclasses.replace(self, **changes)
