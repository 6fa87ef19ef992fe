"""Helpers for the Trainer tests: a tiny job config, running ``twinkle train``, reading weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]


def tiny_job(work_dir: Path, **overrides: Any) -> dict[str, Any]:
    """A few-step LoRA job on the embedded tiny model (fp32 CPU); ``overrides`` replace top-level keys."""
    job: dict[str, Any] = {
        "work_dir": str(work_dir),
        "total_step": 6,
        "global_batch_size": 4,
        "dataloader": {"gradient_accumulation_steps": 2},
        "dataset": {"train_samples": 16, "max_length": 128},
        "checkpoint_interval": 2,
        "progress_bar": False,
    }
    job.update(overrides)
    return job


def write_config(path: Path, job: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(job, allow_unicode=True))
    return path


def cli_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error"}
    env.pop("TWINKLE_TRAINER_TEST_SAVE_SLEEP", None)
    env.update(extra)
    return env


def train_cmd(config: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "twinkle.cli.main", "train", str(config), *overrides]


def run_train(config: Path, *overrides: str, cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(train_cmd(config, *overrides), cwd=cwd, env=cli_env(), capture_output=True, text=True,
                          timeout=timeout)


def load_weights(directory: Path) -> dict[str, Any]:
    """Every tensor of the safetensors files in ``directory`` (an adapter or a full model)."""
    from safetensors.torch import load_file

    tensors: dict[str, Any] = {}
    for file in sorted(directory.glob("*.safetensors")):
        tensors.update(load_file(str(file)))
    assert tensors, f"no safetensors in {directory}"
    return tensors


def assert_bitwise_equal(a: dict[str, Any], b: dict[str, Any]) -> None:
    import torch

    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype == torch.float32, key
        assert torch.equal(a[key], b[key]), f"{key} differs"
