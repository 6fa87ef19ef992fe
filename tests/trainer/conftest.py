"""Shared set-up for the Trainer tests (helpers live in trainer_testing.py)."""

from __future__ import annotations

import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # --import-mode=importlib: make helpers importable


def pytest_configure(config: pytest.Config) -> None:
    # transformers/peft chatter about the tiny model's tied embeddings: expected, not twinkle's
    for message in ("is_gradient_checkpointing", "tie_word_embeddings", "save_embedding_layers",
                    "should not be contained in the prefix"):
        config.addinivalue_line("filterwarnings", f"ignore:.*{message}.*")
