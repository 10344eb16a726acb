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

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from nemo_muon._validation import check_positive_int, shown
from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.models.specs import ModelSpec


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
        """Decoder layers held by each PP rank (all its virtual stages); one pass over the stages."""
        counts = [0] * self.pp
        for k, n in enumerate(self.stage_layers):
            counts[k % self.pp] += n
        return tuple(counts)

    @functools.cached_property
    def _stage_starts(self) -> tuple[int, ...]:
        """First global layer index of each virtual stage."""
        return tuple(itertools.accumulate(self.stage_layers, initial=0))[:-1]

    def pp_rank_layers(self, pp_rank: int) -> list[int]:
        """Global decoder-layer indices on PP rank ``pp_rank`` (virtual stage k lives on rank k mod pp); visits
        only that rank's stages, so all ranks together cost one pass."""
        starts = self._stage_starts
        out: list[int] = []
        for k in range(pp_rank, len(self.stage_layers), self.pp):
            out.extend(range(starts[k], starts[k] + self.stage_layers[k]))
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
MAX_LAYOUT_TEXT = 10_000
"""Longest layout string accepted as written (Kimi K2's on PP4 VP4 has 30 characters)."""
MAX_LAYER_SLOTS = 250_000
"""Decoder layers x (1 + routed experts per layer): the units the planner enumerates (each layer's own tensors, and
each routed expert's). Kimi K2 has 61 x 385 = 23,485; a model past this bound is refused when a recipe is built
(every entry point: ``nemo-muon plan`` and ``launch`` alike) instead of growing memory while it is planned."""


def _repeat_count(layout: str, text: str, i: int) -> tuple[int, int]:
    """The ``n`` of a ``*n`` at ``text[i]`` (ASCII digits) and the index after it."""
    j = i + 1
    while j < len(text) and j - i <= 8 and "0" <= text[j] <= "9":
        j += 1
    if j == i + 1 or j - i > 8:
        raise LayoutError(f"parallelism.pipeline_layout must repeat with *n, n of 1 to 7 ASCII digits; got "
                          f"{shown(layout)} at character {i}")
    return int(text[i + 1:j]), j


def _expand_layout(layout: str) -> str:
    """The layout with every ``(...)*n`` and ``X*n`` written out, refused before it grows past
    `MAX_LAYOUT_SYMBOLS` (the expanded size is counted before each repeat is made)."""
    text = layout.replace(" ", "").replace(",", "")
    stack: list[list[str]] = [[]]
    size = 0  # symbols written out so far, on every level
    i = 0
    while i < len(text):
        char = text[i]
        repeated: str | None = None
        if char == "(":
            stack.append([])
            i += 1
            continue
        if char == ")":
            if len(stack) == 1 or i + 1 >= len(text) or text[i + 1] != "*":
                raise LayoutError(f"parallelism.pipeline_layout must close each '(' with ')*n'; got {shown(layout)}")
            repeated = "".join(stack.pop())
            times, i = _repeat_count(layout, text, i + 1)
        elif char in _LAYOUT_SYMBOLS:
            repeated, i = char, i + 1
            times = 1
            if char != "|" and i < len(text) and text[i] == "*":
                times, i = _repeat_count(layout, text, i)
        else:
            raise LayoutError(f"parallelism.pipeline_layout must use only {tuple(_LAYOUT_SYMBOLS)} with (...)*n / X*n "
                              f"repeats; got {shown(layout)}")
        size += len(repeated) * (times - 1)
        if size > MAX_LAYOUT_SYMBOLS:
            raise LayoutError(f"parallelism.pipeline_layout must expand to at most {MAX_LAYOUT_SYMBOLS} symbols; got "
                              f"{shown(layout)}, which expands past it")
        stack[-1].append(repeated * times)
    if len(stack) != 1:
        raise LayoutError(f"parallelism.pipeline_layout must close each '(' with ')*n'; got {shown(layout)}")
    return "".join(stack[0])


def parse_pipeline_layout(layout: str) -> tuple[int, ...]:
    """Decoder layers per virtual stage of a Megatron ``pipeline_model_parallel_layout`` string.

    Symbols: ``E`` embedding, ``t`` decoder layer, ``m`` MTP layer, ``L`` loss, ``|`` between stages;
    ``(...)*n`` and ``X*n`` repeat. Example: ``"Et|(tt|)*30L"`` -> (1, 2, ..., 2, 0): 32 stages, the last loss-only.
    The text is at most `MAX_LAYOUT_TEXT` characters and expands to at most `MAX_LAYOUT_SYMBOLS` (checked as it
    expands, never after); repeat counts are ASCII digits.
    """
    if not isinstance(layout, str) or len(layout) > MAX_LAYOUT_TEXT:
        raise LayoutError(f"parallelism.pipeline_layout must be a layout string of at most {MAX_LAYOUT_TEXT} "
                          f"characters; got {shown(layout)}")
    text = _expand_layout(layout)
    if not text:
        raise LayoutError(f"parallelism.pipeline_layout must use only {tuple(_LAYOUT_SYMBOLS)} with (...)*n / X*n "
                          f"repeats; got {shown(layout)}")
    return tuple(stage.count("t") for stage in text.split("|"))


def check_layer_slots(spec: ModelSpec) -> None:
    """Raise ValueError when ``spec`` has more than `MAX_LAYER_SLOTS` layer slots (layers x (1 + experts)): a bound
    of the model, not of the layout, so the message names the model's fields, whatever the world size."""
    slots = spec.num_layers * (1 + spec.num_experts)
    if slots > MAX_LAYER_SLOTS:
        raise ValueError(f"model.num_layers x (1 + model.num_experts) must be at most {MAX_LAYER_SLOTS} (the layers "
                          f"and routed experts a plan enumerates; Kimi K2: 61 x 385 = 23,485); got {spec.num_layers} x "
                          f"(1 + {spec.num_experts}) = {slots}")


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
    check_layer_slots(spec)
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
            tuple(stage_layers)
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in stages):
            raise LayoutError(f"pipeline layout must be a layout string or integers per virtual stage; got "
                              f"{shown(stage_layers)}")
        if len(stages) != pp * vp or sum(stages) != spec.num_layers or min(stages) < 0:
            raise LayoutError(
                f"pipeline layout must give pp*vp = {pp}*{vp} = {pp * vp} virtual stages whose decoder layers sum "
                f"to num_layers ({spec.num_layers}); got {shown(list(stages))} from {shown(stage_layers)}"
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
