"""Operators an optimizer step issues, counted by a torch dispatch mode: the launches a GPU would see, on any device.

What counts: every ATen operator that reaches a kernel or a copy when dispatched (``mm``, ``lerp_``, ``cat``,
``_foreach_mul_``, ``_local_scalar_dense``: a read of one value back to the host). What does not: views (the
operator's schema returns an alias of an input: ``transpose``, ``view``, ``_unsafe_view``, ``split``, ``diagonal``,
``expand``, ...; ``OpOverload.is_view``, and `UNMARKED_VIEWS`), allocations that fill nothing (``empty``, ``empty_like``, ``new_empty``,
``empty_strided``) and profiler markers. The count is the same on a CPU as on a GPU for the same code path (the
path may differ by device: Newton–Schulz's algorithm choice, `nemo_muon.accounting.ns_choice`, reads it).

A multi-tensor operator (``torch._foreach_*``) counts as one: on a GPU it is one kernel per chunk of its tensor
list (PyTorch's ``multi_tensor_apply`` starts a new kernel every few dozen tensors or a few hundred 64 Ki-element
blocks), a handful for a rank's matrices where the per-matrix loop issues one per matrix; bandwidth, not launches,
bounds those kernels (docs/step_time.md prices them by bytes).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
"""ATen operators (by base name) that allocate without writing: no kernel."""
UNMARKED_VIEWS = frozenset({"_unsafe_view", "_reshape_alias"})
"""Operators that return a view although their schema does not mark the alias (``matmul`` of a batch ends in
``_unsafe_view``): no kernel."""


def launches(func: Any) -> bool:
    """Whether dispatching ``func`` (an ``OpOverload``) runs a kernel or a copy (module doc)."""
    name = func.name().split("::")[-1].split(".")[0]
    namespace = func.namespace
    return namespace == "aten" and not func.is_view and name not in ALLOCATIONS | UNMARKED_VIEWS


class OperatorCount(TorchDispatchMode):
    """Counts the operators dispatched while active (module doc): ``count`` in all, ``by_name`` per operator."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.by_name: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if launches(func):
            self.count += 1
            self.by_name[func.name().split("::")[-1]] += 1
        return func(*args, **(kwargs or {}))


def count_step(step: Callable[[], Any]) -> OperatorCount:
    """The operators one call of ``step`` (e.g. ``optimizer.step``) issues."""
    with OperatorCount() as counted:
        step()
    return counted
