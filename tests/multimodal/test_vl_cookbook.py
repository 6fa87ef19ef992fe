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
    proc = subprocess.run([sys.executable, str(SCRIPT), "--samples", "16", "--batch-size", "4", "--max-steps", "4",
                           "--results-json", "results.json"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    losses = results["losses"]
    assert len(losses) == 4 and losses[-1] < losses[0] - 1.0
    checkpoint = Path(results["checkpoint"])
    assert checkpoint == tmp_path / "output" / "vl_lora_sft" / "final"
    assert proc.stdout.strip().splitlines()[-1] == (f"loss {losses[0]:.2f} -> {losses[-1]:.2f} in 4 steps "
                                                    f"({results['seconds']} s); adapter: {checkpoint}")
    assert "vl_lora_sft: 100%" in proc.stderr and "4/4" in proc.stderr  # the progress bar, not a line per step
    assert "Warning" not in proc.stderr  # no dependency warning that does not apply (transformers', peft's)
    names = {p.name for p in checkpoint.iterdir()}
    assert {"adapter_model.safetensors", "adapter_config.json", "processor_config.json", "tokenizer.json"} <= names
