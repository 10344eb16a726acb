"""The non-finite policy of engine 'nemo_muon' inside Megatron-Core's layer-wise optimizer: one decision per step,
the same on every rank.

Megatron-Core's own skip-step exists only with a loss scaler (``prepare_grads`` -> found_inf, all-reduced over the
model-parallel group: ``megatron/core/optimizer/optimizer.py``, ``_unscale_main_grads_and_check_for_nan``). bf16 has
no loss scaler, so a non-finite gradient goes through clipping (a NaN clip coefficient) into the update. And with a
loss scaler the layer-wise optimizer would still decide per rank: each data-parallel rank checks only the gradients
of the matrices it owns, and found_inf is not reduced over the data-parallel group
(``megatron/core/optimizer/layer_wise_optimizer.py`` overrides neither ``prepare_grads`` nor the group), so ranks
could disagree and their replicas drift. 0.19's ``grad_norm_skip_threshold`` compares ``grad_norm > threshold``,
which is False for NaN.

What every rank does agree on is the global gradient norm: the layer-wise optimizer all-reduces it over all ranks
(``get_grad_norm``, ``grad_stats_parallel_group=None``), and it is non-finite exactly when some owned gradient is.
`apply_nonfinite_policy` makes the built optimizer act on it, with no extra communication: ``skip`` returns
``update_successful=False`` before any parameter or state changes (Megatron's training loops count it as a skipped
iteration), ``raise`` raises `FloatingPointError` on every rank.
"""

from __future__ import annotations

import math
from typing import Any

from nemo_muon.config.optimizer import NONFINITE_POLICIES
from nemo_muon.megatron.shared.class_switch import same_identity, switch_class


def _policy_class(base: type) -> type:
    """``base`` (a Megatron optimizer class) with the step-level policy in front; same name, module and layout (a
    subclass of ``base`` alone, so a built object's class can be switched to it)."""

    class WithNonFinitePolicy(base):  # type: ignore[misc, valid-type]
        nonfinite_policy: str = "skip"
        skipped_nonfinite_steps: int = 0

        def get_grad_norm(self) -> Any:
            norm = super().get_grad_norm()
            self._nonfinite_norm = norm if norm is not None and not math.isfinite(norm) else None
            return norm

        def step_with_ready_grads(self) -> bool:
            norm = getattr(self, "_nonfinite_norm", None)
            if norm is None:
                return super().step_with_ready_grads()
            self._nonfinite_norm = None
            if self.nonfinite_policy == "raise":
                raise FloatingPointError(f"the global gradient norm is {norm} (optimizer.nonfinite='raise'): a "
                                         "gradient is NaN or infinite on some rank; no parameter was updated")
            self.skipped_nonfinite_steps += 1
            return False

    return same_identity(WithNonFinitePolicy, base)


_POLICY_CLASSES: dict[type, type] = {}


def apply_nonfinite_policy(optimizer: Any, policy: str) -> Any:
    """Give the built Megatron ``optimizer`` (the object whose ``step()`` the training loop calls) the non-finite
    ``policy`` ('skip' or 'raise'): a non-finite global gradient norm is acted on before ``step_with_ready_grads``
    touches any parameter or state. Returns the optimizer, whose class becomes a same-named subclass (Megatron's
    builder of >= 0.18 constructs the object, so it is specialised after construction)."""
    if policy not in NONFINITE_POLICIES:
        raise ValueError(f"optimizer.nonfinite must be one of {NONFINITE_POLICIES}; got {policy!r}")
    switch_class(optimizer, _policy_class, _POLICY_CLASSES)
    optimizer.nonfinite_policy = policy
    return optimizer
