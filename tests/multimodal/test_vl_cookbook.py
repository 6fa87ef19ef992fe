"""cookbook/multimodal/vl_lora_sft.py runs on CPU with the tiny VL model for a few steps and leaves a usable adapter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "cookbook" / "multimodal" / "vl_lora_sft.py"


def test_cookbook_trains_a_few_steps(tmp_path: Path) -> None:
    env = {**os.environ, "TWINKLE_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--samples", "16", "--batch-size", "4", "--max-steps", "4"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    summary = lines[-1]
    assert summary["steps"] == 4 and [r["step"] for r in lines[:-1]] == [1, 2, 3, 4]
    assert summary["last_loss"] < summary["first_loss"] - 1.0
    checkpoint = tmp_path / summary["checkpoint"]
    names = {p.name for p in checkpoint.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "processor_config.json", "tokenizer.json"} <= names
