"""Was a run's throughput measured on a busy machine? The load its metrics recorded, against its own share of it.

Our metrics JSONL records the machine's 1-minute load average at each step (``load_1m``: runnable and waiting tasks of
every process) and, in its ``run`` header, the CPUs the run could use (``cpus``), its ranks on the machine
(``local_ranks``, else ``world_size``) and each rank's intra-op threads (``threads_per_rank``). A run's throughput
was measured with other load when, over its steady steps (the first left out), the median load exceeds the CPUs
(more runnable work than CPUs: someone waited) and the run's own threads (so the excess is not the run itself
oversubscribing its machine), each by more than `MARGIN`. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

from nemo_muon.reporting.records import RunLog

MARGIN = 0.5
"""Load above the CPUs and above the run's own threads before a caveat (the average's noise on a quiet machine and
its lag at a run's start are below it)."""


@dataclass(frozen=True, kw_only=True)
class MachineLoad:
    """The load a run was measured under: median 1-minute load average, CPUs, the run's own threads."""

    load: float
    cpus: int
    own: int

    @property
    def busy(self) -> bool:
        """Other work competed with the run for the CPUs."""
        return self.load > self.cpus + MARGIN and self.load > self.own + MARGIN


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def machine_load(run: RunLog) -> MachineLoad | None:
    """The load ``run`` recorded, or None when its metrics do not say (Megatron logs, older runs)."""
    cpus = _count(run.header.get("cpus"))
    loads = [p.load_1m for p in run.train if p.load_1m is not None]
    loads = loads[1:] if len(loads) >= 2 else loads
    if cpus is None or not loads:
        return None
    ranks = _count(run.header.get("local_ranks")) or run.world_size or 1
    threads = _count(run.header.get("threads_per_rank")) or 1
    return MachineLoad(load=median(loads), cpus=cpus, own=ranks * threads)


def load_caveat(runs: list[RunLog]) -> str | None:
    """One paragraph for report.md when any run's throughput was measured with other load on its machine."""
    busy = [(run.name, found) for run in runs if (found := machine_load(run)) is not None and found.busy]
    if not busy:
        return None
    each = "; ".join(f"{name}: load {m.load:.1f} on {m.cpus} CPUs, {m.own} of it the run's own threads"
                     for name, m in busy)
    return (f"**Caveat: throughput measured with other load on the machine** ({each}; median 1-minute load average "
            "over the steps). Tokens/s, TFLOP/s and their ratios are lower and noisier than on a quiet machine; "
            "losses and steps are not affected.")
