"""Resume in a fresh process continues the uninterrupted run's losses bit for bit (CPU, fp32).

LoRA and full-parameter, AdamW and Muon (the full-model Muon is Muon + AdamW), with dropout on so
the restored RNG state matters, a warm-up cosine schedule, gradient accumulation in one combo,
and the DataLoader resumed from the checkpoint's consumed_train_samples.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)

SCRIPT = Path(__file__).parent / "scripts" / "resume_job.py"


def _run(out: Path, phase: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out), phase], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / f"{phase}.json").read_text())


def test_resume_in_fresh_process_is_bitwise_identical(tmp_path: Path) -> None:
    full = _run(tmp_path, "uninterrupted")
    resumed = _run(tmp_path, "resume")
    for name in ("lora-adamw", "lora-muon", "full-adamw", "full-muon"):
        marker = full[name].index("saved")
        expected_tail = full[name][marker + 1:]
        assert len(expected_tail) >= 3
        assert resumed[name] == expected_tail, name
        progress = resumed[name + ":progress"]
        assert progress["cur_step"] == 3
        assert progress["consumed_train_samples"] == 4 * marker
        assert progress["gradient_accumulation_steps"] == (2 if name == "lora-muon" else 1)
        checkpoint = tmp_path / name
        names = {p.name for p in checkpoint.iterdir()}
        assert {"optimizer.pt", "scheduler.pt", "rng_state.pt", "trainer_state.json"} <= names
        assert ("adapter_model.safetensors" if name.startswith("lora") else "model.safetensors") in names
        assert not any(p.name.startswith(".") for p in tmp_path.iterdir()), "temporary directories left behind"
