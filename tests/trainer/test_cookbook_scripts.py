"""The cookbook scripts run on CPU with the tiny default for a few steps and leave usable checkpoints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_testing import REPO, cli_env, load_weights

from twinkle.trainer import store

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)


def _run(script: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(REPO / "cookbook" / script), *args], cwd=cwd, env=cli_env(),
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_full_sft_trains_every_weight(tmp_path: Path) -> None:
    proc = _run("transformers/full_sft.py", tmp_path, "--tiny-cpu", "--train-samples", "16",
                "--global-batch-size", "4", "--total-step", "4", "--hf-interval", "4")
    work_dir = tmp_path / "output" / "full_sft"
    (step, last), = store.list_checkpoints(work_dir / "checkpoints")
    assert step == 4 and f"checkpoint: {last}" in proc.stdout
    trained = load_weights(last / "model")
    assert not (last / "model" / "adapter_model.safetensors").exists()
    exported = load_weights(work_dir / "hf" / "step-00000004")
    assert sorted(trained) == sorted(exported) and any("layers.0.mlp.down_proj" in k for k in trained)
    records = [json.loads(line) for line in (work_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["loss"] < records[0]["loss"]  # the full model learns the data


def test_megatron_tp_sft_runs_on_cpu_with_tp1(tmp_path: Path) -> None:
    proc = _run("megatron/tp_sft.py", tmp_path, "--tiny-cpu", "--train-samples", "32", "--batch-size", "8",
                "--max-steps", "3")
    last = tmp_path / "output" / "megatron_tp_sft" / "last-checkpoint"
    assert "final checkpoint: output/megatron_tp_sft/last-checkpoint" in proc.stdout
    state = json.loads((last / "trainer_state.json").read_text())
    assert state["cur_step"] == 3 and state["consumed_train_samples"] == 24
    adapter = load_weights(last)
    assert adapter and all("lora_" in key for key in adapter)
