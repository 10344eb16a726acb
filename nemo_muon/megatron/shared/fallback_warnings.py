"""Megatron's import-time warnings of an absent Transformer Engine / Apex, collapsed into one line (torch-free).

Where Megatron-Core is installed without Transformer Engine or Apex (a login node, the CPU test environments), each of
its modules that would use a fused kernel warns as it is imported ("Transformer Engine and Apex are not installed.
Falling back to ...", "Apex is not installed. Falling back to Torch Norm": a dozen ``UserWarning``s), and Bridge's
optional imports log a traceback per missing TE symbol (``megatron.bridge.utils.import_utils``); ``nemo llm pretrain
--dryrun`` showed them all before its plan, since NeMo-Run imports every ``nemo_run.cli`` entry point (Bridge's
``lm`` imports Megatron-Core). `collapse_fallback_warnings`, called where our entry points start
(`nemo_muon.recipes.nemo_run_registration`), shows the first of them as one line naming what is absent and drops the
rest; every other warning is shown as before. In the NGC containers both are installed and nothing changes.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
import warnings
from typing import Any, TextIO

FALLBACK_MESSAGES = re.compile(r"(Transformer Engine and Apex are not installed|Apex is not installed|Only "
                               r"transformer-engine>=)", re.ASCII)
"""The import-time warnings of Megatron-Core's modules when TE / Apex is absent."""
MEGATRON_FILE = re.compile(r".*[/\\]megatron[/\\](core|training|bridge)[/\\].*\Z", re.ASCII | re.DOTALL)
BRIDGE_IMPORT_LOGGER = "megatron.bridge.utils.import_utils"
"""Bridge's optional-import logger: one logged traceback per symbol it cannot import from an absent TE."""
KERNEL_PACKAGES: dict[str, str] = {"Transformer Engine": "transformer_engine", "Apex": "apex"}

_state: dict[str, Any] = {"installed": False, "said": False, "stream": None}


def absent_kernels() -> list[str]:
    """The kernel packages of `KERNEL_PACKAGES` this interpreter cannot import (found without importing them)."""
    return [name for name, module in KERNEL_PACKAGES.items() if importlib.util.find_spec(module) is None]


def fallback_line(absent: list[str]) -> str:
    """The one line that stands for Megatron's fallback warnings."""
    return (f"note: {' and '.join(absent) or 'a fused-kernel package'} not installed here: Megatron-Core uses its "
            "local fallbacks (enough to build and check a recipe; training runs in the NeMo container); its warnings "
            "about it are not repeated")


def _say() -> None:
    if not _state["said"]:
        _state["said"] = True
        print(fallback_line(absent_kernels()), file=_state["stream"] or sys.stderr)


def is_fallback_warning(message: Warning | str, category: type[Warning], filename: str) -> bool:
    """Whether a warning is one of Megatron's absent-TE / Apex fallbacks (a UserWarning from its code)."""
    return (issubclass(category, UserWarning) and bool(MEGATRON_FILE.match(filename))
            and bool(FALLBACK_MESSAGES.search(str(message))))


class _BridgeImportFilter(logging.Filter):
    """Drops Bridge's logged tracebacks of a symbol it cannot import from an absent Transformer Engine."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if text.startswith("Import of ") and "transformer_engine" in text:
            _say()
            return False
        return True


def collapse_fallback_warnings(stream: TextIO | None = None) -> None:
    """From now on (once per process): Megatron's absent-TE / Apex warnings become one line on ``stream`` (default:
    stderr, at the first of them); nothing changes where Megatron-Core is not installed or TE and Apex are."""
    if _state["installed"] or importlib.util.find_spec("megatron") is None or not absent_kernels():
        return
    _state.update(installed=True, stream=stream)
    shown = warnings.showwarning

    def showwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                    file: TextIO | None = None, line: str | None = None) -> None:
        if is_fallback_warning(message, category, filename):
            _say()
            return
        shown(message, category, filename, lineno, file, line)

    warnings.showwarning = showwarning
    logging.getLogger(BRIDGE_IMPORT_LOGGER).addFilter(_BridgeImportFilter())
