"""Public hardware constants of the GPUs the step-time model prices (torch-free).

Each GPU figure is a vendor specification, named with its source; two constants are the same for every GPU and are
assumptions, chosen, not measured here: the operator floor (``KERNEL_FLOOR_S``) and the ring-hop latency
(``NCCL_STEP_LATENCY_S``). docs/step_time.md lists every constant of the model with its source or "assumed", and
how the predictions move with the floor. Peaks come from ``gpu_peaks`` (dense tensor-core TFLOP/s per precision);
this table adds what moves bytes:

- ``hbm_bytes_per_s``: HBM bandwidth of one GPU.
- ``nvlink_bytes_per_s``: NVLink bandwidth of one GPU in one direction (vendor sheets print both directions).
- ``nvlink_domain``: GPUs that share one NVLink domain (8 on an HGX / DGX board, 72 in an NVL72 rack).
- ``scale_out_bytes_per_s``: the scale-out NIC bandwidth of one GPU in one direction (one NIC per GPU).
- ``kernel_floor_s``: the shortest time one operator takes when issued back to back from PyTorch eager (the host's
  dispatch and launch; the GPU waits for it): a small matrix's Newton–Schulz is a chain of such operators.
- ``collective_latency_s``: the fixed cost of one step of a ring collective.

Add a GPU with ``register_hardware`` (its peaks must be in ``gpu_peaks``), or a CPU measured on the spot
(``bench/step_time_cpu.py`` builds one from a GEMM rate, a copy rate and a gloo bandwidth it measures).
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_muon._validation import check_range, fail
from nemo_muon.accounting.gpu_peaks import gpu_peak

GB = 1e9
KERNEL_FLOOR_S = 10e-6
"""Assumed: host time of one eager PyTorch operator on a GPU tensor. Only its lower bound is a published figure: the
CUDA launch alone is 3.8 us back to back (NVIDIA, "Getting Started with CUDA Graphs", 2019); PyTorch's dispatch
chain in front of it (Python, pybind11, autograd, the ATen dispatcher) adds an amount that depends on the host CPU,
5 to 25 us in all being the range usually quoted. 10 us was chosen with the published GB300 points known, and
Qwen3-30B-A3B's agreement with them holds only for a floor of about 5 to 12 us: an input (``nemo-muon plan
--kernel-floor-us``), measured on a GPU by bench/gpu/step_time_ns.py; docs/step_time.md tabulates 3.8 to 25 us."""
NCCL_STEP_LATENCY_S = 5e-6
"""Assumed: one ring step of an NCCL collective, of the order of the NVLink / InfiniBand hop latency (a few us).
No published point moves with it (docs/step_time.md)."""


@dataclass(frozen=True)
class Hardware:
    """What one accelerator computes and moves per second (module doc)."""

    name: str
    peak_flops: dict[str, float]
    """Dense peak FLOP/s per precision ('bf16', 'fp8', and 'fp32' for a CPU)."""
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    nvlink_domain: int
    scale_out_bytes_per_s: float
    kernel_floor_s: float = KERNEL_FLOOR_S
    collective_latency_s: float = NCCL_STEP_LATENCY_S
    sources: tuple[str, ...] = ()
    kind: str = "cuda"
    """The device type ('cuda' or 'cpu'): which NS algorithm nemo-muon picks there (``ns_choice``)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise fail("hardware.name", self.name, "a non-empty string")
        if not self.peak_flops:
            raise fail(f"hardware[{self.name}].peak_flops", self.peak_flops, "at least one precision")
        for precision, value in self.peak_flops.items():
            check_range(f"hardware[{self.name}].peak_flops[{precision}]", value, low=0.0, low_inclusive=False)
        for field in ("hbm_bytes_per_s", "nvlink_bytes_per_s", "scale_out_bytes_per_s"):
            check_range(f"hardware[{self.name}].{field}", getattr(self, field), low=0.0, low_inclusive=False)
        if self.nvlink_domain < 1:
            raise fail(f"hardware[{self.name}].nvlink_domain", self.nvlink_domain, "a positive number of GPUs")
        check_range(f"hardware[{self.name}].kernel_floor_s", self.kernel_floor_s, low=0.0)
        check_range(f"hardware[{self.name}].collective_latency_s", self.collective_latency_s, low=0.0)
        if self.kind not in ("cuda", "cpu"):
            raise fail(f"hardware[{self.name}].kind", self.kind, "'cuda' or 'cpu'")

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s at ``precision``."""
        if precision not in self.peak_flops:
            raise fail("precision", precision, f"one of {tuple(self.peak_flops)} for {self.name}")
        return self.peak_flops[precision]

    def link_bytes_per_s(self, ranks: list[int]) -> float:
        """Bandwidth a ring over ``ranks`` (global ranks, consecutive GPUs share a domain) runs at: NVLink when all
        of them sit in one NVLink domain, the scale-out NIC otherwise (the ring's slowest hop)."""
        domains = {r // self.nvlink_domain for r in ranks}
        return self.nvlink_bytes_per_s if len(domains) <= 1 else self.scale_out_bytes_per_s

    def describe(self) -> dict[str, object]:
        """The constants as a JSON-ready dict (``plan --json``'s ``step_time.hardware``)."""
        return {"name": self.name, "peak_tflops": {k: v / 1e12 for k, v in self.peak_flops.items()},
                "hbm_GB_per_s": self.hbm_bytes_per_s / GB, "nvlink_GB_per_s": self.nvlink_bytes_per_s / GB,
                "nvlink_domain": self.nvlink_domain, "scale_out_GB_per_s": self.scale_out_bytes_per_s / GB,
                "kernel_floor_us": self.kernel_floor_s * 1e6,
                "collective_latency_us": self.collective_latency_s * 1e6, "sources": list(self.sources)}


_HARDWARE: dict[str, Hardware] = {}


def register_hardware(hw: Hardware, *, replace: bool = False) -> None:
    """Add an accelerator to the table (an existing name raises unless ``replace``)."""
    key = hw.name.lower()
    if key in _HARDWARE and not replace:
        raise fail("hardware", hw.name, f"a name not already in the table {tuple(sorted(_HARDWARE))}")
    _HARDWARE[key] = hw


def _gpu(name: str, hbm_tb: float, nvlink_tb_both: float, domain: int, nic_gbit: float, *sources: str) -> Hardware:
    peaks = gpu_peak(name)
    return Hardware(name=name, peak_flops={"bf16": peaks.bf16 * 1e12, "fp8": peaks.fp8 * 1e12},
                    hbm_bytes_per_s=hbm_tb * 1e12, nvlink_bytes_per_s=nvlink_tb_both * 1e12 / 2,
                    nvlink_domain=domain, scale_out_bytes_per_s=nic_gbit * 1e9 / 8,
                    sources=(peaks.source, *sources))


for _hw in (
    _gpu("gb300", 8.0, 1.8, 72, 800.0,
         "NVIDIA GB300 NVL72 specifications: HBM3e 576 TB/s and NVLink 130 TB/s for 72 GPUs (8 TB/s, 1.8 TB/s each)",
         "NVIDIA ConnectX-8 SuperNIC: 800 Gb/s per GPU"),
    _gpu("gb200", 8.0, 1.8, 72, 400.0,
         "NVIDIA GB200 NVL72 specifications: HBM3e 576 TB/s and NVLink 130 TB/s for 72 GPUs",
         "NVIDIA ConnectX-7: 400 Gb/s per GPU"),
    _gpu("b200", 8.0, 1.8, 8, 400.0,
         "NVIDIA HGX B200 specifications: HBM3e 64 TB/s and NVLink 14.4 TB/s for 8 GPUs",
         "NVIDIA DGX B200: 8x ConnectX-7 400 Gb/s"),
    _gpu("h100", 3.35, 0.9, 8, 400.0,
         "NVIDIA H100 datasheet (SXM): HBM3 3.35 TB/s, NVLink 900 GB/s",
         "NVIDIA DGX H100: 8x ConnectX-7 400 Gb/s"),
    _gpu("h200", 4.8, 0.9, 8, 400.0,
         "NVIDIA H200 datasheet (SXM): HBM3e 4.8 TB/s, NVLink 900 GB/s",
         "NVIDIA DGX H200: 8x ConnectX-7 400 Gb/s"),
):
    register_hardware(_hw)


def hardware(name: str) -> Hardware:
    """The table's entry for ``name`` (case-insensitive)."""
    key = name.lower()
    if key not in _HARDWARE:
        raise fail("gpu", name, f"one of {tuple(sorted(_HARDWARE))} for the step-time model (add others with "
                                f"register_hardware)")
    return _HARDWARE[key]


def known_hardware() -> list[str]:
    """Names in the table."""
    return sorted(_HARDWARE)
