"""Dense tensor-core peaks per GPU, and TFLOP/s/GPU and MFU from a measured step time (torch-free).

The table holds dense (no 2:4 sparsity) peaks in TFLOP/s per GPU. Vendor sheets print the sparse figure for
Hopper/Blackwell tensor cores; dense is half of it. Extend it with ``register_gpu_peak`` or a YAML file
(``load_gpu_peaks(path)``: ``{name: {bf16: <TFLOP/s>, fp8: <TFLOP/s>, source: <text>}}``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_muon._validation import check_positive_int, check_range, fail, shown

PEAK_PRECISIONS: tuple[str, ...] = ("bf16", "fp8")
_PRECISION_OF_RECIPE = {"bf16": "bf16", "fp8_cs": "fp8", "mxfp8": "fp8"}


@dataclass(frozen=True)
class GpuPeak:
    """Dense tensor-core peaks of one GPU in TFLOP/s."""

    name: str
    bf16: float
    fp8: float
    source: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            raise fail("gpu_peak.name", self.name, "a non-empty string")
        check_range(f"gpu_peak[{self.name}].bf16", self.bf16, low=0.0, low_inclusive=False)
        check_range(f"gpu_peak[{self.name}].fp8", self.fp8, low=0.0, low_inclusive=False)

    def tflops(self, precision: str) -> float:
        """The dense peak for 'bf16' or 'fp8'."""
        if precision not in PEAK_PRECISIONS:
            raise fail("peak precision", precision, f"one of {PEAK_PRECISIONS}")
        return self.bf16 if precision == "bf16" else self.fp8


_PEAKS: dict[str, GpuPeak] = {}


def register_gpu_peak(peak: GpuPeak, *, replace: bool = False) -> None:
    """Add a GPU to the table (an existing name raises unless ``replace``)."""
    key = peak.name.lower()
    if key in _PEAKS and not replace:
        raise fail("gpu", peak.name, f"a name not already in the peak table {tuple(sorted(_PEAKS))} (or replace=True)")
    _PEAKS[key] = peak


for _peak in (
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): BF16 1,979 / FP8 3,958 TFLOPS with sparsity.
    GpuPeak("h100", 989.5, 1979.0, "NVIDIA H100 datasheet (SXM), dense = sparse/2"),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): same tensor cores as H100 SXM.
    GpuPeak("h200", 989.5, 1979.0, "NVIDIA H200 datasheet (SXM), dense = sparse/2"),
    # NVIDIA HGX B200 spec: FP16/BF16 36 PFLOPS, FP8 72 PFLOPS with sparsity for 8 GPUs.
    GpuPeak("b200", 2250.0, 4500.0, "NVIDIA HGX B200 specifications, 8 GPUs, dense = sparse/2"),
    # NVIDIA GB200 NVL72 spec: FP16/BF16 360 PFLOPS, FP8 720 PFLOPS with sparsity for 72 GPUs.
    GpuPeak("gb200", 2500.0, 5000.0, "NVIDIA GB200 NVL72 specifications, 72 GPUs, dense = sparse/2"),
    # NVIDIA GB300 NVL72 spec: FP16/BF16 360 PFLOPS, FP8/FP6 720 PFLOPS with sparsity for 72 GPUs (FP4 is what grew).
    GpuPeak("gb300", 2500.0, 5000.0, "NVIDIA GB300 NVL72 specifications, 72 GPUs, dense = sparse/2"),
):
    register_gpu_peak(_peak)


def gpu_peak(gpu: str) -> GpuPeak:
    """The peak entry of ``gpu`` (case-insensitive)."""
    key = gpu.lower()
    if key not in _PEAKS:
        raise fail("gpu", gpu, f"one of {tuple(sorted(_PEAKS))} (add others with register_gpu_peak)")
    return _PEAKS[key]


def known_gpus() -> list[str]:
    """Names in the peak table."""
    return sorted(_PEAKS)


GPU_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
"""A GPU name a peak file may add."""
PEAK_FILE_KEYS = ("bf16", "fp8", "source")


def register_gpu_peaks(data: Any, *, where: str, replace: bool = True) -> list[str]:
    """Register every GPU of a parsed peak file ``{name: {bf16: TFLOP/s, fp8: TFLOP/s, source: text}}`` (``where``:
    the file, first in every error), all or none; returns the names. Raises a one-line ValueError naming the entry,
    the value and what is allowed."""
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{where}: (top level) must be a mapping of GPU name -> {{bf16: TFLOP/s, fp8: TFLOP/s, "
                         f"source: text}}; got {shown(data)}")
    peaks = []
    for name, entry in data.items():
        if isinstance(name, bool) or not isinstance(name, (str, int)) or not GPU_NAME.fullmatch(str(name)):
            raise ValueError(f"{where}: GPU name must be 1-64 letters, digits, '_', '.', '-'; got {shown(name)}")
        if not isinstance(entry, dict) or set(entry) - set(PEAK_FILE_KEYS) or not {"bf16", "fp8"} <= set(entry):
            raise ValueError(f"{where}: {name} must be a mapping with keys bf16, fp8 (and source); got {shown(entry)}")
        source = entry.get("source", "")
        if not isinstance(source, str):
            raise ValueError(f"{where}: {name}.source must be a string; got {shown(source)}")
        try:
            peaks.append(GpuPeak(str(name), entry["bf16"], entry["fp8"], source))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    for peak in peaks:
        register_gpu_peak(peak, replace=replace)
    return [p.name for p in peaks]


def load_gpu_peaks(path: str | Path, *, replace: bool = True) -> list[str]:
    """Register every GPU of a YAML file ``{name: {bf16: .., fp8: .., source: ..}}`` (`register_gpu_peaks`);
    returns the names. A file that cannot be read or parsed is a one-line ValueError naming it."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        reason = " ".join(str(e).split())[:200]
        raise ValueError(f"gpu peak file {path} must be a readable YAML file; got ({type(e).__name__}: {reason})") \
            from None
    return register_gpu_peaks(data, where=f"gpu peak file {path}", replace=replace)


def peak_precision_of(recipe_precision: str) -> str | None:
    """Tensor-core precision whose peak bounds a recipe precision (bf16 -> bf16, fp8_cs / mxfp8 -> fp8);
    None for fp32 (no tensor-core peak in the table)."""
    return _PRECISION_OF_RECIPE.get(recipe_precision)


def tflops_per_gpu(flops_per_step: float, step_time_s: float, num_gpus: int) -> float:
    """Achieved TFLOP/s per GPU: FLOPs of one step / step time / GPUs / 1e12."""
    check_range("step_time_s", step_time_s, low=0.0, low_inclusive=False)
    check_positive_int("num_gpus", num_gpus)
    return flops_per_step / step_time_s / num_gpus / 1e12


def mfu(flops_per_step: float, step_time_s: float, num_gpus: int, gpu: str, precision: str = "bf16") -> float:
    """Model FLOPs utilisation: achieved TFLOP/s/GPU over the dense peak of ``gpu`` at ``precision``."""
    return tflops_per_gpu(flops_per_step, step_time_s, num_gpus) / gpu_peak(gpu).tflops(precision)


@dataclass(frozen=True)
class Throughput:
    """TFLOP/s/GPU of one measured step, model-only and model + Newton–Schulz."""

    model_tflops: float
    ns_tflops: float
    mfu_model: float | None
    mfu_total: float | None

    @property
    def total_tflops(self) -> float:
        return self.model_tflops + self.ns_tflops


def throughput(model_flops_per_step: float, ns_flops_per_step: float, step_time_s: float, num_gpus: int,
               gpu: str | None = None, precision: str = "bf16") -> Throughput:
    """TFLOP/s/GPU and (when ``gpu`` is in the table) MFU of a step, with NS counted separately."""
    model = tflops_per_gpu(model_flops_per_step, step_time_s, num_gpus)
    ns = tflops_per_gpu(ns_flops_per_step, step_time_s, num_gpus)
    if gpu is None:
        return Throughput(model, ns, None, None)
    peak = gpu_peak(gpu).tflops(precision)
    return Throughput(model, ns, model / peak, (model + ns) / peak)
