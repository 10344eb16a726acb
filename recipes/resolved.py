"""The resolved-recipe document: a `TrainingRecipe` as plain JSON data, and back, exactly.

A recipe is resolved once (name + overrides -> `execute.build_recipe`, or the CLI's plan) and what every rank and
every executor then receives is this document, not the name and the override strings: ``nemo-muon launch`` writes
it to ``<run dir>/recipe-<sha256[:12]>.json`` (named by its content, so a queued job's document is never replaced
by a later launch's) and the job loads it (``python -m nemo_muon.launchers.run_recipe --recipe-file PATH``);
NeMo-Run's task receives it as a plain dict in its ``run.Partial``.

The document::

    {"format": "nemo-muon/resolved-recipe", "version": 1,
     "source": {"recipe": "<registered name>" | null, "overrides": ["key=value", ...]},
     "recipe": {"name": ..., "model": {...}, "optimizer": {"name": "muon", ...}, "parallelism": {...}, ...}}

Every init field of every section is written (tuples as lists; the optimizer's ``name`` is its kind). Loading
(`from_document`) accepts exactly that: an unknown, missing or wrongly typed field is refused naming the field, the
value and what is allowed, and the recipe is checked by the one validation of a run (`nemo_muon.run_checks.check_run`).
A document never holds a secret: every value goes through `nemo_muon.secret_policy.check_override` when it is
written and when it is read. ``source`` records where the recipe came from (launch.json repeats it); it is not used
to rebuild anything. Torch-free.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

from nemo_muon._validation import check_choice, fail, shown
from nemo_muon.config.files import load_json, make_folder, read_text, write_file
from nemo_muon.config.limits import ENV_NAME
from nemo_muon.config.optimizer import BaseOptimizerConfig
from nemo_muon.config.recipe import TrainingRecipe
from nemo_muon.registry import config_classes
from nemo_muon.secret_policy import check_override

FORMAT = "nemo-muon/resolved-recipe"
VERSION = 1
TOP_KEYS: tuple[str, ...] = ("format", "version", "source", "recipe")
SOURCE_KEYS: tuple[str, ...] = ("recipe", "overrides")
MAX_FILE_BYTES = 1 << 20
"""A recipe document is a few kB; a larger file is refused before it is parsed."""
MAX_KEY_CHARS = 64
"""Longest key a message names whole (a longer one is shown shortened)."""
ENV_FIELD = "recipe.env"


def _init_names(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        head = {"name": value.name} if isinstance(value, BaseOptimizerConfig) else {}
        return {**head, **{n: _plain(getattr(value, n)) for n in _init_names(type(value))}}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _key(path: str, key: Any) -> str:
    """``path.key`` for a message: a long or odd key is shown shortened (`shown`), never whole."""
    text = str(key)
    part = text if len(text) <= MAX_KEY_CHARS and text.isprintable() else shown(key)
    return f"{path}.{part}" if path else part


def _leaves(data: Any, path: str) -> typing.Iterator[tuple[str, Any]]:
    """(path, value) of every leaf under ``data``, depth first (iterative: any nesting JSON parses is walked)."""
    stack: list[tuple[str, Any]] = [(path, data)]
    while stack:
        where, node = stack.pop()
        if isinstance(node, dict):
            stack.extend(reversed([(_key(where, k), v) for k, v in node.items()]))
        elif isinstance(node, list):
            stack.extend(reversed([(f"{where}[{i}]", v) for i, v in enumerate(node)]))
        else:
            yield where, node


def check_no_secret(plain_recipe: Mapping[str, Any], source_overrides: Sequence[str] = ()) -> None:
    """Raise ValueError (`secret_policy.check_override`'s refusal, value masked) if any field of the document names
    or carries a secret: an ``env`` variable with a secret name, a secret-looking value anywhere, an override."""
    try:
        for key, value in _leaves(dict(plain_recipe), ""):
            check_override(key, value)
        for arg in source_overrides:
            key, _, value = str(arg).partition("=")
            check_override(key.strip(), value.strip())
    except ValueError as e:
        raise ValueError(f"a resolved recipe document never holds a secret: {e}") from None


def _check_envelope_secrets(document: Mapping[str, Any]) -> None:
    """`check_no_secret` for the document's other fields (format, version, source): every value, and every
    ``key=value`` string as the override it would be, before any of them is named in an error message."""
    try:
        for key, value in _leaves({k: v for k, v in document.items() if k != "recipe"}, ""):
            check_override(key, value)
            if isinstance(value, str) and "=" in value:
                name, _, text = value.partition("=")
                check_override(name.strip(), text.strip())
    except ValueError as e:
        raise ValueError(f"a resolved recipe document never holds a secret: {e}") from None


def to_document(recipe: TrainingRecipe, *, source: str | None = None,
                overrides: Sequence[str] = ()) -> dict[str, Any]:
    """The resolved document of ``recipe`` (built from registered recipe ``source`` with ``overrides``); raises
    ValueError if the recipe is invalid or would put a secret into the document."""
    if not isinstance(recipe, TrainingRecipe):
        raise fail("recipe", recipe, "a TrainingRecipe")
    recipe.validate()
    plain = _plain(recipe)
    check_no_secret(plain, overrides)
    return {"format": FORMAT, "version": VERSION,
            "source": {"recipe": source, "overrides": [str(o) for o in overrides]}, "recipe": plain}


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (typing.Union, types.UnionType)


def _hint_text(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _decode(path: str, value: Any, hint: Any) -> Any:
    """``value`` (JSON data) as a field of type ``hint``; raises naming ``path``, the value and what is allowed."""
    origin, args = get_origin(hint), get_args(hint)
    if _is_union(hint):
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        if len(members) == 1:
            return _decode(path, value, members[0])
        raise fail(path, value, f"a value of type {_hint_text(hint)}")
    if origin is Literal:
        check_choice(path, value, args)
        return value
    if hint is BaseOptimizerConfig:  # the optimizer: its "name" says which registered config
        return _decode_optimizer(path, value)
    if dataclasses.is_dataclass(hint):
        return _decode_dataclass(path, value, hint)
    if hint is bool:
        if not isinstance(value, bool):
            raise fail(path, value, "true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail(path, value, "an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail(path, value, "a number")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise fail(path, value, "a string")
        return value
    if origin is tuple:
        if not isinstance(value, list) or len(value) != len(args):
            raise fail(path, value, f"a list of {len(args)} values")
        return tuple(_decode(f"{path}[{i}]", v, t) for i, (v, t) in enumerate(zip(value, args, strict=True)))
    if origin is dict:
        if not isinstance(value, dict):
            raise fail(path, value, "an object of names to strings")
        for k, v in value.items():
            if path == ENV_FIELD and not ENV_NAME.fullmatch(k):
                raise fail(f"{path} name", k, "an environment variable name [A-Za-z_][A-Za-z0-9_]* (ASCII, no newline)")
            if not isinstance(v, str):
                raise fail(_key(path, k), v, "a string")
        return dict(value)
    raise fail(path, value, f"a value of type {_hint_text(hint)}")  # a field type this format does not know yet


def _check_keys(path: str, data: Any, allowed: Sequence[str], what: str) -> None:
    if not isinstance(data, dict):
        raise fail(path, data, f"an object with the fields {tuple(allowed)} ({what})")
    unknown = [k for k in data if k not in allowed]
    if unknown:
        raise ValueError(f"{_key(path, unknown[0])} is not a field of {what}: the fields are {tuple(allowed)}; "
                         f"got {shown(unknown[0])}")
    missing = [k for k in allowed if k not in data]
    if missing:
        raise ValueError(f"{path}.{missing[0]} is missing: {what} needs every one of the fields {tuple(allowed)}; "
                         f"got only {shown(tuple(data))}")


def _decode_dataclass(path: str, data: Any, cls: type, skip: Sequence[str] = ()) -> Any:
    names = _init_names(cls)
    _check_keys(path, data, (*skip, *names), cls.__name__)
    hints = get_type_hints(cls)
    kwargs = {n: _decode(f"{path}.{n}", data[n], hints[n]) for n in names}
    return cls(**kwargs)


def _decode_optimizer(path: str, data: Any) -> Any:
    kinds = config_classes()
    if not isinstance(data, dict):
        raise fail(path, data, f"an object whose name is one of {tuple(kinds)}")
    kind = data.get("name")
    check_choice(f"{path}.name", kind, tuple(kinds))
    return _decode_dataclass(path, data, kinds[kind], skip=("name",))


def _check_source(source: Any) -> None:
    _check_keys("source", source, SOURCE_KEYS, "the document's source")
    if source["recipe"] is not None and not isinstance(source["recipe"], str):
        raise fail("source.recipe", source["recipe"], "a recipe name or null")
    overrides = source["overrides"]
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise fail("source.overrides", overrides, "a list of key=value strings")


def from_document(document: Any) -> TrainingRecipe:
    """The `TrainingRecipe` of a resolved document, checked by `nemo_muon.run_checks.check_run` (the one validation
    of a run); raises ValueError naming the field, the value and what is allowed."""
    from nemo_muon.run_checks import check_run

    if isinstance(document, dict):
        _check_envelope_secrets(document)
    _check_keys("document", document, TOP_KEYS, f"a {FORMAT} document")
    if document["format"] != FORMAT:
        raise fail("document.format", document["format"], repr(FORMAT))
    if isinstance(document["version"], bool) or document["version"] != VERSION:
        raise fail("document.version", document["version"], f"{VERSION} (the version this nemo-muon reads)")
    _check_source(document["source"])
    plain = document["recipe"]
    if isinstance(plain, dict):
        check_no_secret(plain, document["source"]["overrides"])
    recipe = _decode_dataclass("recipe", plain, TrainingRecipe)
    check_run(recipe)
    return recipe


def document_text(document: Mapping[str, Any]) -> str:
    """The document as the JSON text written to its file (NaN and infinities are refused)."""
    return json.dumps(document, indent=2, allow_nan=False) + "\n"


def document_path(run_dir: Path, document: Mapping[str, Any]) -> Path:
    """``<run_dir>/recipe-<first 12 hex digits of the SHA-256 of its text>.json``."""
    digest = hashlib.sha256(document_text(document).encode("utf-8")).hexdigest()[:12]
    return Path(run_dir) / f"recipe-{digest}.json"


def write_document(path: Path, document: Mapping[str, Any]) -> Path:
    """Write ``document`` to ``path`` atomically, never through a symbolic link (`nemo_muon.config.files.write_file`);
    returns ``path``."""
    path = Path(path)
    make_folder(path.parent, what="the run folder")
    return write_file(path, document_text(document), what="the resolved recipe document")


def read_document(path: str | Path) -> dict[str, Any]:
    """The JSON data of a document file (not yet checked: pass it to `from_document`); raises ValueError naming the
    file: not a regular file (a FIFO or a device is refused before it is opened), larger than `MAX_FILE_BYTES`, not
    UTF-8, not JSON, nested too deeply or holding an integer too long to be a field."""
    text = read_text(path, max_bytes=MAX_FILE_BYTES, what="--recipe-file")
    return load_json(text, what=f"--recipe-file {shown(str(path))} (a JSON {FORMAT} document)")
