"""The main job (cookbook/transformers/lora_sft.py) runs end to end for a few steps, then resumes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)

SCRIPT = Path(__file__).resolve().parents[2] / "cookbook" / "transformers" / "lora_sft.py"


def _run(cwd: Path, *args: str) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--train-samples", "64", "--eval-samples", "16",
                           "--batch-size", "8", "--eval-interval", "2", "--log-interval", "1", *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr


def test_main_job_trains_saves_and_resumes(tmp_path: Path) -> None:
    out = _run(tmp_path, "--max-steps", "4")
    last = tmp_path / "output" / "lora_sft" / "last-checkpoint"
    assert f"final checkpoint: {last}" in out
    assert (last / "adapter_model.safetensors").is_file() and (last / "optimizer.pt").is_file()
    assert (tmp_path / "output" / "lora_sft" / "best-checkpoint" / "trainer_state.json").is_file()
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["cur_step"] == 4 and state["consumed_train_samples"] == 32

    resumed = _run(tmp_path, "--max-steps", "6", "--resume-from-checkpoint", str(last))
    assert "resumed at step 4 (32 samples consumed)" in resumed
    assert json.loads((last / "trainer_state.json").read_text())["cur_step"] == 6
