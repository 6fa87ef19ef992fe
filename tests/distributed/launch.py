"""Running a torchrun job from a test, bounded by a timeout, with its output kept for the report."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


@dataclass
class JobResult:
    returncode: int
    output: str
    out_dir: Path

    def load(self, name: str, rank: int) -> dict:
        error = self.out_dir / f"{name}.rank{rank}.error"
        if error.exists():
            raise AssertionError(f"{name} failed on rank {rank}:\n{error.read_text()}")
        path = self.out_dir / f"{name}.rank{rank}.pt"
        if not path.exists():
            raise AssertionError(f"{name} left no result on rank {rank}; job output:\n{self.output[-4000:]}")
        return torch.load(path, weights_only=False)


def torchrun(script: str, args: list[str], out_dir: Path, nproc: int = 2,
             timeout: float = 300, env: dict[str, str] | None = None) -> JobResult:
    """``torchrun --standalone --nproc_per_node=nproc script out_dir *args``; a hang becomes a TimeoutExpired failure.

    ``--standalone``: torchrun binds a free port itself, so parallel runs never collide (a fixed port did).
    """
    env = {**os.environ, "DIST_TEST_OUT": str(out_dir), "TWINKLE_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1", **(env or {})}
    env.pop("WORLD_SIZE", None)
    command = [*TORCHRUN, "--standalone", f"--nproc_per_node={nproc}", str(SCRIPTS / script),
               str(out_dir), *args]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    return JobResult(proc.returncode, proc.stdout + proc.stderr, out_dir)
