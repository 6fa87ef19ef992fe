"""Under data parallelism (torchrun, 2 CPU ranks, DDP) every RL and preference loss's gradient equals one process's."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rounding import LORA_TERMS, tiny_hf, within

STEP = tiny_hf(12, 6, extra=LORA_TERMS).step_bound()

SCRIPT = Path(__file__).resolve().parent / "scripts" / "dp_job.py"


def _job_module():
    spec = importlib.util.spec_from_file_location("rl_dp_job", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_every_loss_gradient_under_dp2_equals_one_process(tmp_path):
    env = {**os.environ, "TWINKLE_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=2", str(SCRIPT), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=300)
    for rank in range(2):
        error = tmp_path / f"rl_dp.rank{rank}.error"
        assert not error.exists(), error.read_text()
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    ranks = [torch.load(tmp_path / f"rl_dp.rank{r}.pt", weights_only=True) for r in range(2)]
    job = _job_module()
    reference = job.run()  # one process, the whole batch
    assert set(ranks[0]) == {name for name, _, _ in job.CASES}
    for name, grads in reference.items():
        assert grads and sum(float(g.abs().sum()) for g in grads.values()) > 0, name
        for param, grad in grads.items():
            assert torch.equal(ranks[0][name][param], ranks[1][name][param]), f"{name}: ranks differ at {param}"
            # float32 sums in another order: a step's bound for 6 rows of at most 12 tokens (tests/rounding.py),
            # elementwise as rounding.within scales it (2e-6 of the largest gradient was below that bound)
            torch.testing.assert_close(ranks[0][name][param], grad, **within(STEP, grad))
