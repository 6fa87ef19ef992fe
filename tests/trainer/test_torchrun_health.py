"""Under torchrun (2 CPU processes): ``backend`` chooses the process group's backend (a wrong one is refused
naming the option), ``dataloader.micro_batch_size`` derives the accumulation from the mesh, and
``check_health_interval`` stops every rank with a message naming the unhealthy rank and what it found."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_testing import cli_env

SCRIPT = Path(__file__).parent / "scripts" / "health_ranks.py"


@pytest.mark.slow
def test_backend_mesh_accumulation_and_health_check_on_two_ranks(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(SCRIPT),
           str(tmp_path)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=cli_env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=480)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for rank in (0, 1)
             for line in (tmp_path / f"results-{rank}.jsonl").read_text().splitlines()]
    by = {(line["scenario"], line["rank"]): line for line in lines}
    for rank in (0, 1):
        assert by[("nccl", rank)]["error"].startswith("backend: 'nccl' could not start torch.distributed")
        assert by[("backend", rank)] == {"scenario": "backend", "rank": rank, "backend": "gloo", "gas": 2, "step": 2}
        nan = by[("nan", rank)]["error"]
        assert nan.startswith("health check at step 2 failed: rank 1: non-finite weights in "
                              "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight;"), nan
        assert "rank 0: non-finite weights" not in nan
        probe = by[("probe", rank)]["error"]
        assert probe.startswith("health check at step 1 failed: rank 1: the check computation gave 0.5 where rank 0 "
                                "got")
    assert (tmp_path / "ok" / "checkpoints" / "step-00000002").is_dir()
    assert "health check passed at step 2 (2 ranks)" in proc.stderr
