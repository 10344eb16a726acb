"""Validate a recipe's parallel layout against Megatron-Core's constraints and derive its sizes (torch-free).

The constraints checked, each named in its error message:

- world size = tp·pp·cp·dp (``dp`` is what remains).
- Expert parallelism: the tp·cp·dp ranks of a pipeline stage are regrouped as etp·ep·edp (Megatron's
  ``initialize_model_parallel`` requires the decoder world size to be a multiple of etp·ep·pp), so etp·ep must
  divide tp·cp·dp; ep must divide the number of routed experts; a dense model needs ep = etp = 1.
- Tensor parallelism: attention heads (and GQA query groups) divisible by tp; the expert width divisible by etp;
  with sequence parallelism the sequence (per CP rank) divisible by tp.
- Context parallelism: sequence divisible by 2·cp (Megatron's load-balanced causal split).
- Pipeline: virtual stages (vp > 1) need pp > 1; every one of the pp·vp virtual stages gets at least one decoder
  layer. When num_layers is not a multiple of pp·vp the layout is uneven: Megatron-Bridge's rule for Kimi K2
  (``pipeline_model_parallel_layout``): every virtual stage but the last takes ceil(L / (pp·vp)) layers, the last
  one (which also holds the loss) the rest, e.g. 61 layers on PP4·VP4 -> 4 x 15 + 1, i.e. 16/16/16/13 per PP rank.
- Batch: global batch divisible by micro batch x dp (number of micro batches = global / (micro x dp)).

Virtual stage k lives on PP rank k mod pp (Megatron's interleaved order).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from nemo_muon._validation import check_positive_int
from nemo_muon.config.recipe import TrainingRecipe


class LayoutError(ValueError):
    """A parallel layout that Megatron-Core would reject; the message names the constraint."""


@dataclass(frozen=True)
class Layout:
    """A validated layout: parallel sizes, pipeline placement and batch split."""

    world_size: int
    tp: int
    pp: int
    vp: int
    cp: int
    ep: int
    etp: int
    dp: int
    """Data-parallel size (the distributed optimizer shards over dp·cp ranks)."""
    edp: int
    """Expert data-parallel size: replicas of each expert, = tp·cp·dp / (etp·ep)."""
    num_microbatches: int
    stage_layers: tuple[int, ...]
    """Decoder layers of each virtual stage, in virtual-stage order (pp·vp entries)."""
    uneven: bool
    """True when the layers do not split evenly (Megatron needs an explicit pipeline layout)."""

    @property
    def layers_per_pp_rank(self) -> tuple[int, ...]:
        """Decoder layers held by each PP rank (all its virtual stages)."""
        return tuple(len(self.pp_rank_layers(r)) for r in range(self.pp))

    def pp_rank_layers(self, pp_rank: int) -> list[int]:
        """Global decoder-layer indices on PP rank ``pp_rank`` (virtual stage k lives on rank k mod pp)."""
        out: list[int] = []
        start = 0
        for k, n in enumerate(self.stage_layers):
            if k % self.pp == pp_rank:
                out.extend(range(start, start + n))
            start += n
        return out

    def parallelism(self) -> dict[str, int]:
        """The sizes as a plain dict (tp, pp, vp, cp, ep, etp, dp, edp)."""
        return {"tp": self.tp, "pp": self.pp, "vp": self.vp, "cp": self.cp, "ep": self.ep, "etp": self.etp,
                "dp": self.dp, "edp": self.edp}


def pipeline_stage_layers(num_layers: int, pp: int, vp: int = 1) -> tuple[tuple[int, ...], bool]:
    """Decoder layers per virtual stage (pp·vp of them) and whether the split is uneven (see module doc)."""
    stages = pp * vp
    if num_layers < stages:
        raise LayoutError(
            f"pipeline: every one of pp*vp = {pp}*{vp} = {stages} virtual stages needs a decoder layer; "
            f"the model has {num_layers} layers"
        )
    if num_layers % stages == 0:
        return (num_layers // stages,) * stages, False
    per = -(-num_layers // stages)
    last = num_layers - per * (stages - 1)
    if last < 1:
        raise LayoutError(
            f"pipeline: num_layers ({num_layers}) is not a multiple of pp*vp = {stages}, and the uneven layout "
            f"({per} layers per virtual stage, the rest on the last) leaves the last stage empty ({last}); "
            f"choose pp*vp dividing {num_layers} or with ceil({num_layers}/pp*vp)*(pp*vp-1) < {num_layers}"
        )
    return (per,) * (stages - 1) + (last,), True


_LAYOUT_SYMBOLS = "EtmL|"
MAX_LAYOUT_SYMBOLS = 1_000_000
"""Longest expanded layout string accepted (a real one has a few symbols per layer)."""


def parse_pipeline_layout(layout: str) -> tuple[int, ...]:
    """Decoder layers per virtual stage of a Megatron ``pipeline_model_parallel_layout`` string.

    Symbols: ``E`` embedding, ``t`` decoder layer, ``m`` MTP layer, ``L`` loss, ``|`` between stages;
    ``(...)*n`` and ``X*n`` repeat. Example: ``"Et|(tt|)*30L"`` -> (1, 2, ..., 2, 0): 32 stages, the last loss-only.
    """
    text = layout.replace(" ", "").replace(",", "")
    group = re.compile(r"\(([^()]*)\)\*(\d+)")

    def repeat(m: re.Match[str]) -> str:
        body, times = m.group(1), int(m.group(2))
        if len(text) + len(body) * times > MAX_LAYOUT_SYMBOLS:
            raise LayoutError(f"parallelism.pipeline_layout must expand to at most {MAX_LAYOUT_SYMBOLS} symbols; got "
                              f"{layout[:80]!r} repeating {body[:20]!r} {times} times")
        return body * times

    while True:
        expanded = group.sub(repeat, text)
        if expanded == text:
            break
        text = expanded
    text = re.sub(r"([EtmL])\*(\d+)", repeat, text)
    bad = sorted(set(text) - set(_LAYOUT_SYMBOLS))
    if bad or not text:
        raise LayoutError(
            f"parallelism.pipeline_layout must use only {tuple(_LAYOUT_SYMBOLS)} with (...)*n / X*n repeats; got "
            f"{layout[:200]!r}"
        )
    return tuple(stage.count("t") for stage in text.split("|"))


def validate_layout(recipe: TrainingRecipe, world_size: int | None = None,
                    stage_layers: Sequence[int] | str | None = None) -> Layout:
    """Check ``recipe``'s layout on ``world_size`` GPUs (default: the recipe's) and return the derived sizes.

    ``stage_layers`` is an explicit pipeline layout: decoder layers per virtual stage (pp·vp entries, a stage may be
    empty, e.g. loss-only) or a Megatron layout string (``parse_pipeline_layout``); by default the recipe's
    ``parallelism.pipeline_layout`` when that field exists and is set, else the rule in the module doc. Raises
    ``LayoutError`` (a ValueError) naming the violated constraint.
    """
    world = recipe.world_size if world_size is None else world_size
    check_positive_int("world_size", world)
    par, spec, tr = recipe.parallelism, recipe.model, recipe.trainer
    if stage_layers is None:
        stage_layers = getattr(par, "pipeline_layout", None)
    tp, pp, vp, cp, ep, etp = par.tp, par.pp, par.vp, par.cp, par.ep, par.etp
    mp = tp * pp * cp
    if world % mp:
        raise LayoutError(
            f"world size must be a multiple of tp*pp*cp = {tp}*{pp}*{cp} = {mp} (world = tp*pp*cp*dp); got {world}"
        )
    dp = world // mp
    if not spec.num_experts and (ep > 1 or etp > 1):
        raise LayoutError(f"ep and etp must be 1 for the dense model {spec.name}; got ep={ep}, etp={etp}")
    if spec.num_experts and spec.num_experts % ep:
        raise LayoutError(f"ep must divide the number of experts ({spec.num_experts}) of {spec.name}; got ep={ep}")
    stage_ranks = tp * cp * dp
    if stage_ranks % (etp * ep):
        raise LayoutError(
            f"etp*ep must divide tp*cp*dp (Megatron regroups each pipeline stage's tp*cp*dp = {tp}*{cp}*{dp} = "
            f"{stage_ranks} ranks as etp*ep*edp, dp = world/(tp*pp*cp) = {world}/({tp}*{pp}*{cp})); got etp*ep = "
            f"{etp}*{ep} = {etp * ep} with world {world}"
        )
    edp = stage_ranks // (etp * ep)
    if spec.num_attention_heads % tp:
        raise LayoutError(f"tp must divide num_attention_heads ({spec.num_attention_heads}); got tp={tp}")
    if spec.attention == "gqa" and spec.num_query_groups % tp:
        raise LayoutError(f"tp must divide num_query_groups ({spec.num_query_groups}); got tp={tp}")
    if spec.num_experts and spec.moe_ffn_hidden_size % etp:
        raise LayoutError(f"etp must divide moe_ffn_hidden_size ({spec.moe_ffn_hidden_size}); got etp={etp}")
    if cp > 1 and tr.seq_length % (2 * cp):
        raise LayoutError(f"trainer.seq_length must be divisible by 2*cp = {2 * cp}; got {tr.seq_length}")
    if par.sequence_parallel and (tr.seq_length // cp) % tp:
        raise LayoutError(
            f"trainer.seq_length / cp must be divisible by tp={tp} with sequence_parallel; got {tr.seq_length}"
        )
    if vp > 1 and pp == 1:
        raise LayoutError(f"parallelism.vp must be 1 unless pp > 1 (vp > 1 interleaves virtual pipeline stages over "
                          f"the pipeline ranks); got pp=1, vp={vp}")
    if stage_layers is None:
        stages, uneven = pipeline_stage_layers(spec.num_layers, pp, vp)
    else:
        stages = parse_pipeline_layout(stage_layers) if isinstance(stage_layers, str) else \
            tuple(int(n) for n in stage_layers)
        if len(stages) != pp * vp or sum(stages) != spec.num_layers or min(stages) < 0:
            raise LayoutError(
                f"pipeline layout must give pp*vp = {pp}*{vp} = {pp * vp} virtual stages whose decoder layers sum "
                f"to num_layers ({spec.num_layers}); got {list(stages)} from {stage_layers!r}"
            )
        uneven = len(set(stages)) > 1
    per_step = tr.micro_batch_size * dp
    if tr.global_batch_size % per_step:
        raise LayoutError(
            f"trainer.global_batch_size must be divisible by micro_batch_size*dp = {tr.micro_batch_size}*{dp} = "
            f"{per_step}; got {tr.global_batch_size}"
        )
    return Layout(world_size=world, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, etp=etp, dp=dp, edp=edp,
                  num_microbatches=tr.global_batch_size // per_step, stage_layers=stages, uneven=uneven)
