"""torchrun job: run the named scenarios on every rank and save each rank's results.

Usage: torchrun --nproc_per_node=2 train_job.py OUT_DIR SCENARIO [SCENARIO ...]
Writes OUT_DIR/<scenario>.rank<r>.pt, or OUT_DIR/<scenario>.rank<r>.error with the traceback.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenarios import SCENARIOS, rank_world  # noqa: E402

import twinkle  # noqa: E402


def main() -> None:
    out, names = Path(sys.argv[1]), sys.argv[2:]
    twinkle.initialize(seed=0, timeout_s=120)
    rank, _ = rank_world()
    for name in names:
        try:
            result = SCENARIOS[name]()
        except Exception:
            (out / f"{name}.rank{rank}.error").write_text(traceback.format_exc())
            raise
        torch.save(result, out / f"{name}.rank{rank}.pt")


if __name__ == "__main__":
    main()
