"""Fixtures for the RL and preference tests: tiny models from configs (helpers in rl_testing.py and tests/hf)."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "hf"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "ignore:.*is_gradient_checkpointing.*:FutureWarning")
    config.addinivalue_line("filterwarnings", "ignore:.*should not be contained in the prefix.*:UserWarning")


@pytest.fixture(scope="module", autouse=True)
def _cpu_device() -> Any:
    """CPU-exact comparisons, also on a GPU machine."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TWINKLE_DEVICE", "cpu")
        yield
