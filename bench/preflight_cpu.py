"""`nemo-muon preflight` on CPU gloo ranks: the report a preflight writes, and its optimizer-step ratio.

Runs `nemo_muon.preflight.main.preflight_on_rank` on ``--world`` ranks with the test harness's CUDA shims
(tests/megatron_cpu/shims.py: on CPU Megatron-Core needs them; on GPUs `nemo-muon preflight` runs without; where
Bridge's setup builds ours, its TE import stub too), with the Megatron-Core (and Bridge) of the interpreter:
`.venv/bin/python bench/preflight_cpu.py --recipe kimi_k2_muon_split`. Prints
preflight.md (written under ``--out``) and the step-time figure: the median optimizer step of the recipe's path over
the reference path's, both measured in this run on the same ranks.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _rank(rank: int, world: int, group: object, request: object) -> dict:
    from nemo_muon.preflight.bridge_setup import bridge_setup_applies
    from tests.megatron_cpu import shims

    if bridge_setup_applies():  # ours through Bridge's setup: Bridge imports (with the harness's TE stub) before
        # the shims replace torch.cuda names (transformers annotates with torch.cuda.Stream at import)
        from tests.megatron_cpu.te_stub import bridge_imports_without_te

        bridge_imports_without_te()
    shims.install()
    from nemo_muon.preflight.main import preflight_on_rank

    doc, code = preflight_on_rank(request)
    return {"code": code, "ratio": doc["figures"]["step_time_ratio"], "steps_s": doc["figures"]["optimizer_step_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="kimi_k2_muon_split")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--ep", type=int, default=1)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="/tmp/nemo-muon-preflight")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    from nemo_muon.preflight.report import MARKDOWN_NAME
    from nemo_muon.preflight.request import PreflightRequest
    from nemo_muon.train.spawn import spawn_ranks

    request = PreflightRequest(recipe=args.recipe, world_size=args.world, overrides=tuple(args.overrides),
                               steps=args.steps, pp=args.pp, ep=args.ep, out_dir=args.out)
    result = spawn_ranks(_rank, args.world, (request,), timeout_s=900, daemon=False)[0]
    print((Path(args.out) / MARKDOWN_NAME).read_text())
    print(f"optimizer step, {args.recipe}'s path / reference path (median after warm-up, slowest rank): "
          f"{result['ratio']:.2f}x; exit code {result['code']}")


if __name__ == "__main__":
    main()
