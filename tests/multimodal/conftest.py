"""Fixtures for the multimodal tests: the two tiny VL families, templates over them, shape images."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # make vl_testing importable

import pytest  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _cpu_device():
    """CPU-exact comparisons, also on a GPU machine."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TWINKLE_DEVICE", "cpu")
        yield


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "ignore:.*is_gradient_checkpointing.*:FutureWarning")
