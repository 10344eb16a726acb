"""Torch-free cost models: model FLOPs, Newton–Schulz FLOPs (``ns_count``, the one NS FLOP formula) and the NS
algorithm / TP-mode choice (``ns_choice``), GPU peaks and MFU, layout validation, layer-wise ownership
(``ownership_plan``: LPT and baselines; ``model_ownership``: per-stage plans of a ModelSpec) and the planner. The
planner and the engines (``nemo_muon.optim``, ``nemo_muon.layerwise``, ``nemo_muon.megatron``) import them from here.

Counting rules: docs/flops.md.
"""

from nemo_muon.accounting.gpu_peaks import (
    GpuPeak,
    Throughput,
    gpu_peak,
    known_gpus,
    load_gpu_peaks,
    mfu,
    register_gpu_peak,
    tflops_per_gpu,
    throughput,
)
from nemo_muon.accounting.layout import Layout, LayoutError, parse_pipeline_layout, validate_layout
from nemo_muon.accounting.model_flops import ModelFlops, model_flops_per_step, model_flops_per_token
from nemo_muon.accounting.ns_count import NSFlops, matrix_ns_flops, ns_flops, ns_flops_per_tp_rank
from nemo_muon.accounting.planner import plan_recipe

__all__ = [
    "GpuPeak",
    "Layout",
    "LayoutError",
    "ModelFlops",
    "NSFlops",
    "Throughput",
    "gpu_peak",
    "known_gpus",
    "load_gpu_peaks",
    "matrix_ns_flops",
    "mfu",
    "model_flops_per_step",
    "model_flops_per_token",
    "ns_flops",
    "ns_flops_per_tp_rank",
    "parse_pipeline_layout",
    "plan_recipe",
    "register_gpu_peak",
    "tflops_per_gpu",
    "throughput",
    "validate_layout",
]
