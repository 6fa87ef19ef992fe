"""Shared fixtures for the twinkle-hf tests (helpers live in hf_testing.py, importable from test modules)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # --import-mode=importlib: make hf_testing importable

from hf_testing import make_batch, make_model  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    # transformers/peft deprecation chatter triggered inside peft, not by twinkle
    config.addinivalue_line("filterwarnings", "ignore:.*is_gradient_checkpointing.*:FutureWarning")
    config.addinivalue_line("filterwarnings", "ignore:.*should not be contained in the prefix.*:UserWarning")


@pytest.fixture(scope="module", autouse=True)
def _cpu_device() -> Any:
    """Tests compare against CPU references and CPU-exact numbers, also on a GPU machine.

    Module-scoped and autouse, so it is in place before any module-scoped model fixture; gpu tests
    take the GPU back with ``monkeypatch.delenv('TWINKLE_DEVICE')``.
    """
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TWINKLE_DEVICE", "cpu")
        yield


@pytest.fixture
def tiny() -> Callable[..., Any]:
    return make_model


@pytest.fixture
def batch() -> Callable[..., dict[str, torch.Tensor]]:
    return make_batch
