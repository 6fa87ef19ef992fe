"""Hostile inputs and faults (issue 13): shared set-up. Helpers come from the hf and trainer test folders."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for folder in (HERE, HERE.parent / "hf", HERE.parent / "trainer"):
    sys.path.insert(0, str(folder))  # --import-mode=importlib: make hf_testing / trainer_testing importable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def pytest_configure(config: pytest.Config) -> None:
    for message in ("is_gradient_checkpointing", "tie_word_embeddings", "save_embedding_layers",
                    "should not be contained in the prefix"):
        config.addinivalue_line("filterwarnings", f"ignore:.*{message}.*")


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-step ``tiny_job`` run (4 rows per step: 2 micro-batches of 2) with checkpoints at steps 2 and 4;
    tests copy it (``hostile_testing.copy_run``) before damaging it."""
    from trainer_testing import tiny_job

    from twinkle.trainer import Trainer

    wd = tmp_path_factory.mktemp("run") / "wd"
    Trainer(**tiny_job(wd, total_step=4)).fit()
    return wd


@pytest.fixture(autouse=True)
def _cpu_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWINKLE_DEVICE", "cpu")
