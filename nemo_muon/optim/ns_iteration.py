"""Newton–Schulz orthogonalization of 2-D matrices and 3-D stacks, with tensor-parallel modes.

``newton_schulz(x, ...)`` returns the orthogonalized (``U S' Vᵀ`` with S' ≈ I) version of ``x``, in fp32.
Under tensor parallelism ``x`` is this rank's shard along ``partition_dim`` and the result is this rank's shard of
the orthogonalized full matrix. ``newton_schulz_many`` does the same for a list of matrices and fuses their
collectives: one all-gather for all duplicated-mode shards, and per round one all-reduce per bucket for all
distributed-mode Gram matrices.

TP modes (``tp_group`` of size p, ``partition_dim`` -2/-1 or the positive equivalents of the last two dims):
- ``duplicated``: gather the shards, full NS on every rank, keep the own slice (equals the unsharded result exactly).
- ``distributed``: NS on the shard, sums over the contracted side all-reduced (Gram NS: one all-reduce of an m×m
  matrix in total). Needs the shard along the long (contracted) side; a shard along the short side falls back to
  duplicated (logged), which gives the same result at the price of a gather.
- ``blockwise``: each shard alone, no communication; the result depends on p (measured deviation in
  docs/optimizers.md).
- ``auto``: duplicated or distributed per matrix by the cost model in ``nemo_muon.accounting.ns_choice``.
Precision: ``fp32`` runs the iterations in fp32 (TF32 on GPU if torch.set_float32_matmul_precision allows it);
``bf16`` runs them in bf16 after an fp32 normalization, like emerging-optimizers' "medium" precision.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
import torch.distributed as dist

from nemo_muon._validation import check_choice, check_positive_int, fail
from nemo_muon.accounting.ns_choice import (
    DEFAULT_TP_COST,
    TPCostModel,
    choose_algorithm,
    choose_tp_mode,
    gram_diverges,
)
from nemo_muon.config.optimizer import COEFFICIENT_SETS, TP_MODES, check_ns_schedule
from nemo_muon.config.optimizer import NS_PRECISIONS as PRECISIONS
from nemo_muon.optim.coefficients import coefficient_schedule
from nemo_muon.optim.ns_kernels import ns_program, run_programs
from nemo_muon.optim.ns_stacks import STACK_BYTES, chunked, stacked, unstacked
from nemo_muon.registry.cost import NS_ALGORITHMS

logger = logging.getLogger(__name__)

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DEFAULT_BUCKET_BYTES = 64 * 2**20
_logged_fallbacks: set[tuple[int, ...]] = set()


class _BucketedAllReduce:
    """Sum tensors over ``group``: fused into flat buffers of at most ``bucket_bytes`` (one collective each)."""

    def __init__(self, group: dist.ProcessGroup, bucket_bytes: int) -> None:
        self.group, self.bucket_bytes, self.calls = group, bucket_bytes, 0

    def __call__(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        out: list[torch.Tensor] = [t for t in tensors]
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i, t in enumerate(tensors):
            by_dtype.setdefault(t.dtype, []).append(i)
        for idx in by_dtype.values():
            bucket: list[int] = []
            size = 0
            for i in [*idx, None]:
                nbytes = 0 if i is None else tensors[i].numel() * tensors[i].element_size()
                if bucket and (i is None or size + nbytes > self.bucket_bytes):
                    flat = torch.cat([tensors[j].reshape(-1) for j in bucket])
                    dist.all_reduce(flat, group=self.group)
                    self.calls += 1
                    for j, piece in zip(bucket, flat.split([tensors[j].numel() for j in bucket]), strict=True):
                        out[j] = piece.view_as(tensors[j])
                    bucket, size = [], 0
                if i is not None:
                    bucket.append(i)
                    size += nbytes
        return out


def gather_shards(shards: list[torch.Tensor], dims: list[int], group: dist.ProcessGroup) -> list[torch.Tensor]:
    """All-gather every shard in one collective and rebuild each full matrix along its partition dim (equal shards,
    group rank order)."""
    flat = torch.cat([s.reshape(-1) for s in shards])
    world = dist.get_world_size(group)
    parts = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(parts, flat, group=group)
    sizes = [s.numel() for s in shards]
    per_rank = [p.split(sizes) for p in parts]
    return [
        torch.cat([per_rank[r][i].view_as(shards[i]) for r in range(world)], dim=dims[i]) for i in range(len(shards))
    ]


def _normalize_partition_dim(name: str, partition_dim: int | None, ndim: int, has_group: bool) -> int | None:
    if partition_dim is None:
        return None
    allowed = (-2, -1, ndim - 2, ndim - 1)
    if isinstance(partition_dim, bool) or not isinstance(partition_dim, int) or partition_dim not in allowed:
        extra = " (dim 0 of a 3-D stack is the expert dim: shard experts with expert parallelism)" if ndim == 3 else ""
        raise ValueError(f"{name} must be None or one of {tuple(sorted(set(allowed)))} for a {ndim}-D input"
                         f"{extra}; got {partition_dim!r}")
    if not has_group:
        raise ValueError(f"{name} must be None when tp_group is None (only a TP shard has a partition dim); "
                         f"got {partition_dim!r}")
    return partition_dim - ndim if partition_dim >= 0 else partition_dim


def _check_input(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.ndim not in (2, 3) or not x.is_floating_point():
        got = f"shape {tuple(x.shape)}, dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a floating-point 2-D matrix or 3-D stack (E, m, n); got {got}")


def newton_schulz_many(
    xs: Sequence[torch.Tensor],
    steps: int = 5,
    coefficients: str = "quintic",
    *,
    tp_group: dist.ProcessGroup | None = None,
    tp_mode: str = "duplicated",
    partition_dims: Sequence[int | None] | int | None = None,
    precision: str = "fp32",
    algorithm: str = "auto",
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    tp_cost: TPCostModel = DEFAULT_TP_COST,
    stats: dict | None = None,
    stack: bool = False,
    stack_bytes: int = STACK_BYTES,
) -> list[torch.Tensor]:
    """Orthogonalize every matrix of ``xs`` (see the module docstring), fusing the collectives of all of them.

    ``partition_dims``: one per matrix (or one for all). ``algorithm``: ``auto`` (Gram NS for matrices at least
    ``ns_choice.GRAM_MIN_ASPECT`` times wider than tall, standard in bf16 for a set of ``ns_choice.GRAM_BF16_DIVERGES``,
    where ``gram`` is refused), ``standard`` or ``gram``. ``stats``, if given, receives
    ``modes`` (per matrix: local, duplicated, distributed or blockwise), ``all_reduce_calls`` and
    ``all_gather_calls`` and ``stacks`` (programs run).
    ``stack``: matrices that run the same program on the same shape (same TP mode and partition dim, same algorithm
    and orientation) are stacked into one batched program of at most ``stack_bytes`` fp32 input
    (`nemo_muon.optim.ns_stacks`): one operator per stack instead of one per matrix, each result equal to its own
    NS within fp32 reordering; composes with every TP mode (a stack of shards is gathered, reduced or kept alike).
    """
    check_positive_int("steps", steps)
    check_choice("coefficients", coefficients, COEFFICIENT_SETS)
    check_ns_schedule(coefficients, steps)
    check_choice("tp_mode", tp_mode, TP_MODES)
    check_choice("precision", precision, PRECISIONS)
    check_choice("algorithm", algorithm, ("auto", *NS_ALGORITHMS))
    check_positive_int("stack_bytes", stack_bytes)
    xs = list(xs)
    dims = list(partition_dims) if isinstance(partition_dims, (list, tuple)) else [partition_dims] * len(xs)
    if len(dims) != len(xs):
        raise ValueError(f"partition_dims must have one entry per matrix ({len(xs)}); got {len(dims)}")
    world = 1 if tp_group is None else dist.get_world_size(tp_group)
    coeffs = coefficient_schedule(coefficients, steps)
    dtype = _DTYPES[precision]
    if algorithm == "gram" and gram_diverges(coefficients, dtype):
        raise fail("algorithm", algorithm, f"'standard' or 'auto' with coefficients={coefficients!r} in precision "
                                           f"{precision!r} (its bf16 Gram iteration diverges: "
                                           f"accounting.ns_choice.GRAM_BF16_DIVERGES)")

    modes: list[str] = []
    for i, x in enumerate(xs):
        _check_input(f"x[{i}]" if len(xs) > 1 else "x", x)
        pdim = _normalize_partition_dim("partition_dim", dims[i], x.ndim, tp_group is not None)
        dims[i] = pdim
        if pdim is None or world == 1:
            modes.append("local")
            continue
        full = [x.shape[-2], x.shape[-1]]
        full[pdim] *= world
        mode = tp_mode
        if mode == "auto":
            mode = choose_tp_mode((full[0], full[1]), pdim, world, steps, tp_cost)
        if mode == "distributed" and full[pdim] < full[pdim + 1 if pdim == -2 else -2]:
            key = (full[0], full[1], pdim)
            if key not in _logged_fallbacks:
                _logged_fallbacks.add(key)
                logger.info("newton_schulz: shard of %s along dim %d is on the short side; distributed NS would "
                            "whiten the long side, so this matrix uses duplicated mode (same result)", full, pdim)
            mode = "duplicated"
        modes.append(mode)

    dup = [i for i, m in enumerate(modes) if m == "duplicated"]
    work = [x.float() for x in xs]
    all_gather_calls = 0
    if dup:
        fulls = gather_shards([work[i] for i in dup], [dims[i] for i in dup], tp_group)
        all_gather_calls = 1
        for i, f in zip(dup, fulls, strict=True):
            work[i] = f

    reducer = _BucketedAllReduce(tp_group, bucket_bytes) if "distributed" in modes else None
    keys, transposed, algos = [], [], []
    for i, x in enumerate(work):
        if modes[i] == "distributed":
            t = dims[i] == -2  # make the sharded (long) side the contracted columns
            full_long = x.shape[-2] * world if t else x.shape[-1] * world
            short = x.shape[-1] if t else x.shape[-2]
            algo = (choose_algorithm(short, full_long, x.device, dtype, coefficients) if algorithm == "auto"
                    else algorithm)
        else:
            t = x.shape[-2] > x.shape[-1]
            algo = (choose_algorithm(x.shape[-2], x.shape[-1], x.device, dtype, coefficients) if algorithm == "auto"
                    else algorithm)
        transposed.append(t)
        algos.append(algo)
        # one stack per key: the same program on the same shape, reduced (or not) and cut the same way
        same = (modes[i], t, algo, dims[i] if modes[i] in ("duplicated", "distributed") else None,
                tuple(x.shape[-2:]), x.dtype, x.device)
        keys.append(same if stack else i)
    runs = chunked(keys, [x.numel() * 4 for x in work], stack_bytes)
    # oriented before stacking: a stack of tall matrices is copied contiguous in the orientation NS works in
    programs = [ns_program(stacked([_oriented(work[i], transposed[i]) for i in run]), coeffs,
                           algorithm=algos[run[0]], compute_dtype=dtype) for run in runs]
    results = run_programs(programs, [reducer if modes[run[0]] == "distributed" else None for run in runs])

    out: list[torch.Tensor | None] = [None] * len(xs)
    for run, y in zip(runs, results, strict=True):
        i = run[0]
        y = _oriented(y.float(), transposed[i])
        if modes[i] == "duplicated":
            y = y.chunk(world, dim=dims[i])[dist.get_rank(tp_group)]
        for j, piece in zip(run, unstacked(y.contiguous(), [xs[j] for j in run]), strict=True):
            out[j] = piece
    if stats is not None:
        stats.update(modes=modes, all_reduce_calls=reducer.calls if reducer else 0, all_gather_calls=all_gather_calls,
                     stacks=len(runs))
    return out  # type: ignore[return-value]


def _oriented(x: torch.Tensor, transposed: bool) -> torch.Tensor:
    return x.mT if transposed else x


def newton_schulz(
    x: torch.Tensor,
    steps: int = 5,
    coefficients: str = "quintic",
    *,
    tp_group: dist.ProcessGroup | None = None,
    tp_mode: str = "duplicated",
    partition_dim: int | None = None,
    precision: str = "fp32",
    algorithm: str = "auto",
) -> torch.Tensor:
    """Orthogonalize one 2-D matrix or 3-D stack (E, m, n) (per matrix); see the module docstring. Returns fp32."""
    return newton_schulz_many(
        [x], steps, coefficients, tp_group=tp_group, tp_mode=tp_mode, partition_dims=[partition_dim],
        precision=precision, algorithm=algorithm,
    )[0]
