"""Shared torchrun launches: each runs many scenarios once per session; tests read their results."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "scripts"))

from launch import JobResult, torchrun  # noqa: E402
from scenarios import HSDP, SCENARIOS  # noqa: E402

#: Everything the training job runs in one 2-process launch (~30 s on 2 cores).
TRAINING = [name for name in SCENARIOS if name not in HSDP]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "ignore:.*is_gradient_checkpointing.*:FutureWarning")
    config.addinivalue_line("filterwarnings", "ignore:.*should not be contained in the prefix.*:UserWarning")


@pytest.fixture(autouse=True)
def _cpu_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TWINKLE_DEVICE", "cpu")


@pytest.fixture(scope="session")
def training_job(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    out = tmp_path_factory.mktemp("training_job")
    result = torchrun("train_job.py", TRAINING, out, timeout=420)
    assert result.returncode == 0, f"torchrun training job failed:\n{result.output[-6000:]}"
    return result


@pytest.fixture(scope="session")
def hsdp_job(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    """4 processes as dp=2 x fsdp=2 (HSDP)."""
    out = tmp_path_factory.mktemp("hsdp_job")
    result = torchrun("train_job.py", list(HSDP), out, nproc=4, timeout=300)
    assert result.returncode == 0, f"torchrun HSDP job failed:\n{result.output[-6000:]}"
    return result
