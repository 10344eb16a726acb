"""One validation, run when a recipe is built: everything a run needs beyond each section's own fields.

`check_run` is what `nemo_muon.recipes.execute.build_recipe` calls, and every entry point builds recipes through it
(``nemo llm pretrain --dryrun``, ``nemo-muon plan``, ``nemo-muon launch`` and the job each rank runs), so they accept
and refuse the same recipes. It checks, in order: the sections again; the schedule (warmup shorter than training,
as Megatron's scheduler asserts); the optimizer against its registry entry (`check_optimizer`); ``system.preflight``
only where preflight can prove the path (`check_preflight`); the sequence against the model's positions; the backend's own rules (`nemo_muon.train.recipe_rules`,
`nemo_muon.megatron.shared.recipe_rules`); the parallel layout on the recipe's world size
(`accounting.layout.validate_layout`); the widths grouped GEMMs need at the recipe's precision. Torch-free.

What only the machine that runs the job can know stays with the job: whether CUDA or bf16 kernels exist there,
whether data paths exist, whether a run folder already holds a run, whether ``logging.root`` resolved against the
launch folder is still mount-safe.
"""

from __future__ import annotations

from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.registry import check_split_target

GROUPED_GEMM_ALIGNMENT: dict[str, int] = {"fp32": 4, "bf16": 8, "fp8_cs": 16, "mxfp8": 32}
"""Multiple of elements an expert GEMM width must be, per precision: torch._grouped_mm needs 16-byte strides
("strides should be multiple of 16 bytes": 4 fp32 / 8 bf16 elements, measured with torch 2.14); Transformer
Engine's FP8 GEMMs need dimensions divisible by 16, MXFP8 by its 32-element scaling block."""
def check_schedule(recipe: TrainingRecipe) -> None:
    """Warmup must end before training does (Megatron asserts lr_warmup_steps < lr_decay_steps = max_steps)."""
    warmup, steps = recipe.scheduler.warmup_steps, recipe.trainer.max_steps
    if warmup >= steps:
        raise ValueError(f"scheduler.warmup_steps must be < trainer.max_steps ({steps}) so the learning rate reaches "
                         f"its peak and decays; got {warmup}: set scheduler.warmup_steps={max(0, steps // 10)}")


def check_optimizer(recipe: TrainingRecipe) -> None:
    """The optimizer is registered (`nemo_muon.registry.spec_for`), and its entry allows the recipe's split target.
    Which engines it has is the megatron mapping's rule (`megatron_optimizer_spec`, which the megatron recipe rules
    run)."""
    check_split_target(recipe.optimizer)


def check_preflight(recipe: TrainingRecipe) -> None:
    """``system.preflight`` only where `nemo-muon preflight` can prove the path: the megatron backend with a
    layer-wise matrix optimizer (AdamW runs Megatron's own distributed optimizer; the torch backend trains on CPU)."""
    from nemo_muon.registry import spec_for

    if not recipe.system.preflight:
        return
    if recipe.backend != "megatron" or spec_for(recipe.optimizer).matrix is None:
        raise ValueError(f"system.preflight must be false for backend={recipe.backend!r} with optimizer.kind="
                         f"{recipe.optimizer.name!r}: preflight proves the megatron backend's layer-wise matrix "
                         f"optimizers (muon, soap, normuon, ...); got True")


def check_sequence(recipe: TrainingRecipe) -> None:
    """The sequence fits the model's positions (RoPE scaling and the torch backend's models are built for them)."""
    seq, positions = recipe.trainer.seq_length, recipe.model.max_position_embeddings
    if seq > positions:
        raise ValueError(f"trainer.seq_length must be <= model.max_position_embeddings ({positions}); got {seq}")


def check_grouped_gemm_widths(recipe: TrainingRecipe) -> None:
    """MoE expert widths (and every MLP width in FP8) are multiples of `GROUPED_GEMM_ALIGNMENT` at the precision."""
    spec, kind = recipe.model, recipe.precision.kind
    align = GROUPED_GEMM_ALIGNMENT[kind]
    widths = ["hidden_size", "moe_ffn_hidden_size"] if spec.num_experts else []
    if kind in ("fp8_cs", "mxfp8"):
        widths = ["hidden_size", "moe_ffn_hidden_size", "ffn_hidden_size"]
    for name in widths:
        value = getattr(spec, name)
        if value % align:
            raise ValueError(f"model.{name} must be a multiple of {align} with precision.kind={kind!r} (grouped "
                             f"expert GEMMs need {align}-element aligned rows); got {value}")


def check_run(recipe: TrainingRecipe) -> None:
    """Raise a ValueError (naming the field, the value and what is allowed) for anything any entry point or the
    recipe's backend would refuse later."""
    from nemo_muon.accounting.layout import LayoutError, validate_layout

    recipe.validate()
    check_optimizer(recipe)
    check_preflight(recipe)
    check_schedule(recipe)
    check_sequence(recipe)
    try:
        if recipe.backend == "torch":
            from nemo_muon.train.recipe_rules import check_torch_backend

            check_torch_backend(recipe)
        else:
            from nemo_muon.megatron.shared.recipe_rules import check_megatron_recipe

            check_megatron_recipe(recipe)  # its Bridge field mapping needs the layout too
        validate_layout(recipe)
    except LayoutError as e:
        s = recipe.system
        raise LayoutError(f"{e} (layout on system.num_nodes*system.gpus_per_node = {s.num_nodes}*{s.gpus_per_node} = "
                          f"{s.world_size} ranks)") from None
    check_grouped_gemm_widths(recipe)
