"""Gradient reduction overlapped with backward: a bucket's reduction starts once backward has accumulated the
grads of all its params (``Tensor.register_post_accumulate_grad_hook``), while earlier layers are still in backward.

With gradient accumulation, wrap the backward of every micro-batch but the last in ``no_sync()`` (as with DDP);
a grad accumulated into a bucket whose reduction already started raises instead of being silently lost.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch

from nemo_muon.layerwise.buckets import Bucket


class GradReduceHooks:
    """Per-param post-accumulate hooks that launch each bucket's async reduction when its grads are complete."""

    def __init__(self, buckets: Sequence[Bucket]) -> None:
        self.buckets = list(buckets)
        self.enabled = True
        self._ready = [0] * len(self.buckets)
        self._handles = [p.register_post_accumulate_grad_hook(functools.partial(self._on_grad, k))
                         for k, b in enumerate(self.buckets) for p in b.params]

    def _on_grad(self, k: int, _param: torch.Tensor) -> None:
        if not self.enabled:
            return
        bucket = self.buckets[k]
        if bucket.launched:
            raise RuntimeError(
                "a gradient was accumulated into a bucket whose reduction had already started (a second backward "
                "before step()); with overlap_grad_reduce=True wrap the backward of every micro-batch but the last "
                "in `with optimizer.no_sync():`"
            )
        self._ready[k] += 1
        if self._ready[k] == len(bucket.params):
            bucket.start_reduce()

    def reset(self) -> None:
        """Forget the counts (after the reductions of a step were collected)."""
        self._ready = [0] * len(self.buckets)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward inside this block only accumulates grads (no reduction starts)."""
        previous, self.enabled = self.enabled, False
        try:
            yield
        finally:
            self.enabled = previous

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []
