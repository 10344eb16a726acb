"""Bounded YAML for the files operators keep (cluster profiles): small, plain, and named in every error.

PyYAML's ``safe_load`` runs no code but trusts the size of what it builds: a few hundred bytes of nested aliases
(``&a [*b, *b, ...]``) expand to gigabytes, and the errors echo the expanded value. `load_yaml_file` reads at most
`MAX_BYTES`, decodes strict UTF-8, refuses aliases (``*name``) and merge keys (``<<``), nesting deeper than
`MAX_DEPTH` or more than `MAX_NODES` nodes, and duplicate keys (PyYAML keeps the last one silently). Every problem
is one ValueError naming the file and where (key path, or line and column), cut to `MAX_MESSAGE` characters.
Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from nemo_muon.config.files import read_file

MAX_BYTES = 256 * 1024
"""Largest file read (a profiles file with dozens of clusters is a few KB; the cap bounds parse time to ~1 s)."""
MAX_DEPTH = 16
"""Deepest nesting of mappings/lists (profiles use 3: name -> settings -> env/mounts)."""
MAX_NODES = 20_000
"""Most scalars + mappings + lists in one document."""
MAX_MESSAGE = 400
"""Longest error message (the parts quoting the file are cut first)."""
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Refused(ValueError):
    """A document that parses but breaks a rule here (duplicate or merge keys)."""


def cut(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters (the cut stated)."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and caps nesting depth and node count while composing."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{cut(event.anchor, 40)}) are not allowed: write the value out",
                event.start_mark)
        self._nodes += 1
        if self._nodes > MAX_NODES or self._depth >= MAX_DEPTH:
            what = f"more than {MAX_NODES} values" if self._nodes > MAX_NODES else f"nesting deeper than {MAX_DEPTH}"
            raise yaml.composer.ComposerError(None, None, f"{what} is not allowed", event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _check_keys(loader: _BoundedLoader, node: Node, path: str) -> None:
    """Refuse duplicate and merge keys anywhere under ``node`` (``path``: the key path, for the message)."""
    if isinstance(node, SequenceNode):
        for i, item in enumerate(node.value):
            _check_keys(loader, item, f"{path}[{i}]")
        return
    if not isinstance(node, MappingNode):
        return
    seen: dict[Any, int] = {}
    for key_node, value_node in node.value:
        where = f"line {key_node.start_mark.line + 1}"
        if key_node.tag == _MERGE_TAG:
            raise _Refused(f"{path or '(top level)'}: merge keys (<<) are not allowed ({where}); write the keys out")
        key = loader.construct_object(key_node) if isinstance(key_node, ScalarNode) else None
        if isinstance(key_node, ScalarNode) and key in seen:
            raise _Refused(f"{path or '(top level)'}: key {cut(repr(key), 60)} must appear once; got it again at "
                             f"{where} (first at line {seen[key]}): duplicates are refused, not overwritten")
        seen[key] = key_node.start_mark.line + 1
        _check_keys(loader, value_node, f"{path}.{cut(str(key), 60)}" if path else cut(str(key), 60))


def _yaml_message(e: yaml.YAMLError) -> str:
    if isinstance(e, yaml.MarkedYAMLError):
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        context = f" ({cut(e.context, 80)})" if e.context else ""
        return f"{where}must be valid YAML; got {cut(e.problem or '', 200)}{context}"
    return f"must be valid YAML; got {cut(str(e), 200)}"


def load_yaml_file(path: Path, *, max_bytes: int = MAX_BYTES) -> Any:
    """The one YAML document in ``path`` (None for an empty file), within the bounds above; ValueError names the
    file in every failure (missing, unreadable, too large, not UTF-8, not YAML, aliases, duplicates, too deep)."""
    try:  # a regular file only (a FIFO or a device is refused before it is opened), at most max_bytes
        data = read_file(path, max_bytes=max_bytes, what=f"{path}:")
    except ValueError as e:
        raise ValueError(cut(str(e), MAX_MESSAGE)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(cut(f"{path}: must be UTF-8 text (YAML); got byte {data[e.start]:#04x} at offset {e.start}, "
                             "not UTF-8 (a binary file?)", MAX_MESSAGE)) from None
    loader = None
    try:
        loader = _BoundedLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _check_keys(loader, node, "")
        return loader.construct_document(node)
    except _Refused as e:
        raise ValueError(cut(f"{path}: {e}", MAX_MESSAGE)) from None
    except yaml.YAMLError as e:
        raise ValueError(cut(f"{path}: {_yaml_message(e)}", MAX_MESSAGE)) from None
    except (ValueError, TypeError, OverflowError, RecursionError) as e:
        raise ValueError(cut(f"{path}: must be valid YAML; got {type(e).__name__}: {e}", MAX_MESSAGE)) from None
    finally:
        if loader is not None:
            loader.dispose()
