"""GPU check of `nemo-muon doctor`'s probes (the GPU branch cannot run on the CPU CI).

Run on a GPU machine: ``python bench/gpu/doctor_gpu.py``. It collects the real facts, checks their shape
(CUDA available, one entry per visible device with name / (major, minor) capability / memory, an NCCL version)
and that the judged items 'gpus', 'cuda' and 'nccl' are ok; prints the doctor JSON and exits 1 on a mismatch.
The judging logic itself is tested on CPU in tests/test_cli_doctor.py with facts written by the test.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict


def main() -> int:
    import torch
    from nemo_muon.launchers.doctor import collect_facts, judge

    from nemo_muon.versions import current_release

    facts = collect_facts()
    checks = {c.name: c for c in judge(facts, current_release())}
    problems = []
    if not facts.cuda_available or len(facts.gpus) != torch.cuda.device_count():
        problems.append(f"expected {torch.cuda.device_count()} GPUs in facts; got {facts.gpus}")
    for gpu in facts.gpus:
        cap = gpu["capability"]
        if not (isinstance(cap, list) and len(cap) == 2 and all(isinstance(x, int) for x in cap)):
            problems.append(f"capability must be [major, minor]; got {cap!r}")
        if list(torch.cuda.get_device_capability(0)) != cap and len(facts.gpus) == 1:
            problems.append(f"capability {cap} differs from torch's {torch.cuda.get_device_capability(0)}")
    for name in ("gpus", "cuda", "nccl"):
        if name not in checks or checks[name].status != "ok":
            problems.append(f"{name} should be ok on a GPU machine; got {checks.get(name)}")
    print(json.dumps({"facts": asdict(facts), "checks": [asdict(c) for c in checks.values()],
                      "problems": problems}, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
