"""Which registered optimizer a logged name or a run / recipe name means, from the registry alone (no table of names).

Reports read an optimizer from a run's log (ours writes the registered name; a Megatron log says Megatron's name:
``dist_muon``, ``adam``, ``nemo_muon.normuon``) or, failing that, from the run's or recipe's name (``kimi_k2_adamw_bf16``,
``tiny_kimi_k2_normuon-20250101``). A name is found as a whole token only, so ``normuon`` is never Muon and
``adamuon`` neither Adam nor Muon.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from nemo_muon.registry.spec import OptimizerSpec


@dataclass(frozen=True)
class Mention:
    """Where a name mentions an optimizer: its spec and the span ``text[start:end]`` that names it."""

    spec: OptimizerSpec
    start: int
    end: int


def logged_names(specs: Sequence[OptimizerSpec] | None = None) -> dict[str, OptimizerSpec]:
    """Every name that means one registered optimizer -> its spec (``specs``: default every registered one): the
    registered names, and the names Megatron / Bridge log (`MegatronSpec.logged_names`) where they mean one
    optimizer: the only one that logs it ('adam' is AdamW), else the family's own, named like the family ('muon',
    'dist_muon': Muon, not NorMuon, which logs them too on Megatron-Core 0.16)."""
    if specs is None:
        from nemo_muon.registry import specs as registered

        specs = registered()
    by_name = {s.name: s for s in specs}
    loggers: dict[str, list[OptimizerSpec]] = {}
    for spec in specs:
        for name in spec.megatron.logged_names():
            loggers.setdefault(name, []).append(spec)
    out = dict(by_name)
    for name, who in loggers.items():
        heads = [s for s in who if s.name == s.megatron.bridge_name]  # the family's own optimizer
        if name not in out and (len(who) == 1 or len(heads) == 1):
            out[name] = who[0] if len(who) == 1 else heads[0]
    return out


def spec_called(name: str | None, specs: Sequence[OptimizerSpec] | None = None) -> OptimizerSpec | None:
    """The optimizer ``name`` means exactly (case-insensitive; `logged_names`), or None."""
    return logged_names(specs).get(name.lower()) if name else None


def _is_token_end(text: str, i: int) -> bool:
    return i < 0 or i >= len(text) or not text[i].isascii() or not text[i].isalnum()


def mentioned(text: str | None, specs: Sequence[OptimizerSpec] | None = None) -> Mention | None:
    """The optimizer ``text`` mentions: the last of the `logged_names` standing in it as a whole token (between
    characters that are not ASCII letters or digits), the longest of those that end there; case-insensitive; None
    when there is none. Linear in ``len(text)`` for a given registry."""
    if not text:
        return None
    low = text.lower()
    best: tuple[int, int, OptimizerSpec] | None = None
    for name, spec in logged_names(specs).items():
        start = low.find(name)
        while start >= 0:
            end = start + len(name)
            if _is_token_end(low, start - 1) and _is_token_end(low, end) and (
                    best is None or (end, end - start) > (best[1], best[1] - best[0])):
                best = (start, end, spec)
            start = low.find(name, start + 1)
    return None if best is None else Mention(best[2], best[0], best[1])
