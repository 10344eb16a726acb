"""NeMo-Run-style ``a.b=value`` overrides applied to a `TrainingRecipe`, with errors that list what is valid.

Keys (NeMo's section names are accepted as aliases: ``optim`` = ``optimizer``, ``log`` = ``logging``):

* ``<section>.<field>=value`` for the sections model, optimizer, parallelism, system, trainer, scheduler, data,
  precision, checkpoint, logging (``optim.lr=3e-4``, ``trainer.max_steps=100``, ``model.num_layers=2``);
* ``<field>=value`` for the recipe's own fields (``backend=torch``, ``qk_clip=true``, ``layerwise=false``);
* ``env.<NAME>=value`` sets an environment variable of the run (never a secret: an override naming or carrying one,
  ``env.HF_TOKEN=...``, ``env.DB_URL=postgres://u:pw@h/db``, is refused by `nemo_muon.secret_policy`'s policy:
  export the variable and pass it by name);
* NeMo 2's names (``trainer.num_nodes``, ``data.global_batch_size``, ``optim.config.lr``, ``log.log_dir``...) set
  our field of the same meaning (`NEMO2_NAMES`), or are refused naming the field to set (`NEMO2_REFUSED`);
* ``optimizer=muon|adamw|soap`` switches the optimizer to that kind's defaults, keeping lr and weight_decay;
  ``model=<name>`` picks another model spec from `nemo_muon.models.specs.MODEL_SPECS`.

Values are converted by the field's type (bool: true/false/1/0/yes/no; tuples: ``(0.9,0.95)`` or ``0.9,0.95``;
``none``/``null`` for optional fields), then every section is validated again. Overrides apply in order, so
``optim=adamw optim.eps=1e-5`` works. Torch-free.
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args, get_origin, get_type_hints

from nemo_muon._validation import check_choice, shown
from nemo_muon.config.limits import ENV_NAME
from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.models.specs import MODEL_SPECS
from nemo_muon.registry import names, spec_named
from nemo_muon.secret_policy import check_override, shown_redacted

SECTION_ALIASES: dict[str, str] = {"optim": "optimizer", "log": "logging"}
NEMO2_NAMES: dict[str, str] = {
    # NeMo 2's llm recipes' override names (nemo/collections/llm/recipes: trainer, data, optim, log, resume) that
    # mean what one of our fields means, in the same unit: accepted, and set that field
    "trainer.num_nodes": "system.num_nodes",
    "trainer.devices": "system.gpus_per_node",
    "trainer.val_check_interval": "trainer.eval_interval",
    "trainer.limit_val_batches": "trainer.eval_iters",
    "trainer.log_every_n_steps": "trainer.log_interval",
    "trainer.strategy.tensor_model_parallel_size": "parallelism.tp",
    "trainer.strategy.pipeline_model_parallel_size": "parallelism.pp",
    "trainer.strategy.virtual_pipeline_model_parallel_size": "parallelism.vp",
    "trainer.strategy.context_parallel_size": "parallelism.cp",
    "trainer.strategy.expert_model_parallel_size": "parallelism.ep",
    "trainer.strategy.expert_tensor_parallel_size": "parallelism.etp",
    "trainer.strategy.sequence_parallel": "parallelism.sequence_parallel",
    "data.global_batch_size": "trainer.global_batch_size",
    "data.micro_batch_size": "trainer.micro_batch_size",
    "data.seq_length": "trainer.seq_length",
    "optim.config.lr": "optimizer.lr",
    "optim.config.weight_decay": "optimizer.weight_decay",
    "optim.config.clip_grad": "trainer.grad_clip",
    "optim.lr_scheduler.warmup_steps": "scheduler.warmup_steps",
    "log.log_dir": "logging.root",
    "log.name": "logging.run_name",
    "log.ckpt.every_n_train_steps": "checkpoint.save_interval",
    "resume.resume_if_exists": "checkpoint.resume",
    "model.config.<field>": "model.<field>",
}
"""NeMo 2 name -> ours. ``model.config.<field>`` stands for every field of the model config."""
NEMO2_REFUSED: dict[str, str] = {
    # NeMo 2 names whose meaning or unit differs from the nearest field here: refused, naming that field
    "trainer.max_epochs": "trainer.max_steps (runs are counted in steps)",
    "trainer.accumulate_grad_batches": "trainer.global_batch_size (accumulation is derived: global batch / (micro "
                                       "batch x DP))",
    "trainer.precision": "precision.kind (bf16, fp8_cs, mxfp8, fp32)",
    "trainer.plugins.precision": "precision.kind (bf16, fp8_cs, mxfp8, fp32)",
    "optim.config.optimizer": "optimizer=<name> (a registered optimizer: muon, adamw, soap, normuon)",
    "optim.config.min_lr": "scheduler.min_lr_ratio (the final rate as a fraction of optimizer.lr)",
    "optim.lr_scheduler.min_lr": "scheduler.min_lr_ratio (the final rate as a fraction of optimizer.lr)",
    "optim.lr_scheduler.max_steps": "trainer.max_steps (the schedule spans the run)",
    "optim.lr_scheduler.constant_steps": "scheduler.wsd_decay_fraction (with scheduler.kind=wsd)",
    "optim.config.adam_beta1": "optimizer.betas=(b1,b2) (AdamW) or optimizer.adamw_betas=(b1,b2) (Muon, SOAP)",
    "optim.config.adam_beta2": "optimizer.betas=(b1,b2) (AdamW) or optimizer.adamw_betas=(b1,b2) (Muon, SOAP)",
    "optim.config.adam_eps": "optimizer.eps (AdamW) or optimizer.adamw_eps (Muon, SOAP)",
    "data.tokenizer": "data.tokenizer_dir (a Hugging Face tokenizer folder)",
    "data.paths": "data.path (one Megatron indexed-dataset prefix, with data.kind=indexed)",
    "log.tensorboard": "logging.tensorboard=true",
}
"""NeMo 2 name -> the field to set here instead, and why it is not the same."""
_MODEL_CONFIG = "model.config."
SECTIONS: tuple[str, ...] = (
    "model", "optimizer", "parallelism", "system", "trainer", "scheduler", "data", "precision", "checkpoint",
    "logging",
)
TOP_LEVEL_KEYS: tuple[str, ...] = ("name", "backend", "layerwise", "qk_clip", "qk_clip_threshold", "qk_clip_alpha",
                                   "hf_config")
MAX_DIGITS = 30
"""Longest integer an override takes (every bound of a field is far shorter; ``int()`` of 5000 digits is refused by
Python itself, with a message that names no field)."""
_INT = re.compile(rf"[+-]?[0-9]{{1,{MAX_DIGITS}}}", re.ASCII)
_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,4})?|nan|inf|infinity)",
                    re.ASCII | re.IGNORECASE)
"""ASCII only: ``int()`` and ``float()`` also take any script's digits ('١٢') and underscores."""
_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _init_fields(obj: Any) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(obj) if f.init)


def valid_keys(recipe: TrainingRecipe) -> list[str]:
    """Every override key this recipe accepts (``env.<NAME>`` stands for any variable name)."""
    keys = [*TOP_LEVEL_KEYS, "optimizer", "model", "env.<NAME>"]
    for section in SECTIONS:
        keys += [f"{section}.{f}" for f in _init_fields(getattr(recipe, section))]
    return keys


def split_override(arg: str) -> tuple[str, str]:
    """``'optim.lr=3e-4'`` -> ``('optim.lr', '3e-4')``; raises unless the argument has the form key=value."""
    key, sep, value = arg.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"override must have the form key=value (e.g. optim.lr=3e-4); got {shown_redacted(arg)}")
    return key.strip(), value.strip()


def nemo2_key(key: str) -> str:
    """Our key for a NeMo 2 override name (`NEMO2_NAMES`), ``key`` itself when it is none; a NeMo 2 name whose
    meaning differs here (`NEMO2_REFUSED`) is refused, naming the field to set instead."""
    if key in NEMO2_REFUSED:
        raise ValueError(f"override key {shown(key)} is NeMo 2's; it has no exact equivalent here: set "
                         f"{NEMO2_REFUSED[key]}")
    if key.startswith(_MODEL_CONFIG):
        return "model." + key[len(_MODEL_CONFIG):]
    return NEMO2_NAMES.get(key, key)


def _canonical(key: str, recipe: TrainingRecipe) -> tuple[str, str | None]:
    """Resolve aliases and check the key exists: returns (section or top-level name, field or None)."""
    head, _, field = key.partition(".")
    head = SECTION_ALIASES.get(head, head)
    if not field:
        check_choice("override key", head, (*TOP_LEVEL_KEYS, "optimizer", "model", *SECTION_ALIASES))
        return head, None
    if head == "env":
        if not ENV_NAME.match(field):
            raise ValueError(f"override key env.<NAME> must name an environment variable [A-Za-z_][A-Za-z0-9_]*; "
                             f"got {shown(key)}")
        return head, field
    check_choice(f"override key section (in {shown(key)})", head, (*SECTIONS, "env", *SECTION_ALIASES))
    section = getattr(recipe, head)
    fields = _init_fields(section)
    if field not in fields:
        raise ValueError(
            f"override key {shown(key)} is unknown: {head} ({type(section).__name__}) has the fields {fields}; got "
            f"{shown(field)}"
        )
    return head, field


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (typing.Union, types.UnionType)


def convert_value(key: str, raw: Any, hint: Any) -> Any:
    """Convert a command-line string to the field type ``hint`` (non-strings must already have that type)."""
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        check_choice(key, text, args)
        return text
    if _is_union(hint):
        if type(None) in args and text.lower() in ("none", "null"):
            return None
        members = [a for a in args if a is not type(None)]
        errors = []
        for member in members:
            try:
                return convert_value(key, text, member)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if len(errors) == 1 else f"{key} must be one of the types {members}; got {shown(raw)}")
    if hint is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ValueError(f"{key} must be a boolean (one of {_TRUE + _FALSE}); got {shown(raw)}")
    if hint is int:
        if not _INT.fullmatch(text):
            raise ValueError(f"{key} must be an integer (ASCII digits, at most {MAX_DIGITS}); got {shown(raw)}")
        return int(text)
    if hint is float:
        if not _FLOAT.fullmatch(text):
            raise ValueError(f"{key} must be a number (ASCII digits, e.g. 3e-4); got {shown(raw)}")
        return float(text)
    if hint is str:
        return text.strip("'\"")
    if origin is tuple:
        items = [t for t in text.strip("()[] ").split(",") if t.strip()]
        elem_types = [a for a in args if a is not Ellipsis]
        if Ellipsis not in args and len(items) != len(elem_types):
            raise ValueError(f"{key} must be a tuple of {len(elem_types)} values like (a,b); got {shown(raw)}")
        if Ellipsis in args:
            elem_types = elem_types * len(items)
        pairs = enumerate(zip(items, elem_types, strict=True))
        return tuple(convert_value(f"{key}[{i}]", item, t) for i, (item, t) in pairs)
    raise ValueError(f"{key} cannot be set from the command line (type {hint}); got {shown(raw)}")


def _switch_optimizer(recipe: TrainingRecipe, kind: Any) -> Any:
    """The registered optimizer ``kind`` at the recipe's lr and weight decay, its other fields at their defaults (on
    the megatron backend: the registry entry's ``recipe_defaults``, what Megatron-Core can honour). A variant of the
    current optimizer (one config class derived from the other: Muon <-> NorMuon) keeps every field they share, so
    ``optimizer=normuon`` on a Muon recipe changes the update and nothing else, except a split target
    (``ns_split_target``, Kimi K2's Muon recipes: 1.02), which stays only where the new optimizer splits a matrix's
    update (NorMuon does not: whole tensors, its default)."""
    check_choice("optimizer", kind, names())
    current, spec = recipe.optimizer, spec_named(kind)
    new, old = spec.config_class, type(current)
    values = dict(spec.megatron.recipe_defaults) if recipe.backend == "megatron" else {}
    if issubclass(new, old) or issubclass(old, new):
        fields_of = [{f.name for f in dataclasses.fields(cls) if f.init} for cls in (new, old)]
        shared = fields_of[0] & fields_of[1]
        if spec.matrix is None or not spec.matrix.splittable:
            shared.discard("ns_split_target")
        values.update({name: getattr(current, name) for name in shared})
    return new(**{**values, "lr": current.lr, "weight_decay": current.weight_decay})


def apply_overrides(recipe: TrainingRecipe, overrides: Sequence[str] | Mapping[str, Any]) -> TrainingRecipe:
    """A new, validated recipe with ``overrides`` applied in order (the input recipe is not changed).

    ``overrides`` is a list of ``key=value`` strings or a mapping key -> value (strings are converted by type, each
    where it is given). Consecutive fields of sections are set together, so a rule between two fields of one section
    holds whichever comes first (``optimizer.coefficients=aol optimizer.ns_steps=4``).
    """
    pairs = list(overrides.items()) if isinstance(overrides, Mapping) else [split_override(a) for a in overrides]
    pending: dict[str, dict[str, Any]] = {}
    for given, raw in pairs:
        check_override(given, raw)
        key = nemo2_key(given)
        head, field = _canonical(key, recipe)
        if field is not None and head != "env":
            hints = get_type_hints(type(getattr(recipe, head)))
            pending.setdefault(head, {})[field] = convert_value(f"{head}.{field}", raw, hints[field])
            continue
        recipe = _set_fields(recipe, pending)
        if head == "env":
            if not isinstance(raw, str):
                raise ValueError(f"{key} must be a string; got {shown(raw)}")
            recipe = dataclasses.replace(recipe, env={**recipe.env, field: raw})
        elif field is None and head == "optimizer":
            recipe = dataclasses.replace(recipe, optimizer=_switch_optimizer(recipe, raw))
        elif field is None and head == "model":
            check_choice("model", raw, tuple(MODEL_SPECS))
            recipe = dataclasses.replace(recipe, model=MODEL_SPECS[raw])
        else:
            hint = get_type_hints(TrainingRecipe)[head]
            recipe = dataclasses.replace(recipe, **{head: convert_value(key, raw, hint)})
    recipe = _set_fields(recipe, pending)
    recipe.validate()
    return recipe


def _set_fields(recipe: TrainingRecipe, pending: dict[str, dict[str, Any]]) -> TrainingRecipe:
    """``recipe`` with the converted field values of ``pending`` (section -> field -> value) set, each section
    replaced once (and so validated once, with all its new values); ``pending`` is emptied."""
    for head, values in pending.items():
        recipe = dataclasses.replace(recipe, **{head: dataclasses.replace(getattr(recipe, head), **values)})
    pending.clear()
    return recipe


def check_secret_overrides(overrides: Sequence[str]) -> None:
    """Raise ValueError on the first ``key=value`` that names or carries a secret (the same refusal as
    `apply_overrides`; CLIs call it before printing or recording anything). Arguments without ``=`` are skipped."""
    for arg in overrides:
        key, sep, value = arg.partition("=")
        if sep:
            check_override(key.strip(), value.strip())


def check_override_keys(recipe: TrainingRecipe, overrides: Sequence[str]) -> None:
    """Raise on the first malformed or unknown key, without converting values (fast pre-check for CLIs)."""
    for arg in overrides:
        key, _ = split_override(arg)
        _canonical(nemo2_key(key), recipe)
