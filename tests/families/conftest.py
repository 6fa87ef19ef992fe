"""Fixtures of the family matrix: every seed-001 language family written once as a tiny model directory."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# remote code (GLM-4 / InternLM2 tokenizers, the InternLM2 model) is copied into transformers' modules
# cache; keep it out of the user's home
os.environ.setdefault("HF_MODULES_CACHE", tempfile.mkdtemp(prefix="twinkle-families-modules-"))
sys.path.insert(0, str(Path(__file__).parent))  # family_testing, imported by the test modules


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "ignore:Transformer Engine and Apex are not installed:UserWarning")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:megatron")
    config.addinivalue_line("filterwarnings", "ignore::FutureWarning:megatron")
    config.addinivalue_line("filterwarnings", "ignore:.*is_gradient_checkpointing.*:FutureWarning")


@pytest.fixture(autouse=True)
def _single_process(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("TWINKLE_DEVICE", "cpu")


@pytest.fixture(scope="session")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    """``{family key: model directory}`` for every family of :data:`family_testing.FAMILIES`."""
    from family_testing import FAMILIES, write_model

    root = tmp_path_factory.mktemp("families")
    return {key: write_model(family, root / key) for key, family in FAMILIES.items()}


@pytest.fixture(autouse=True, scope="package")
def _leave_torch_cuda_as_found():
    """MegatronModel's CPU-compatibility module patches torch.cuda.current_device; undo it after this package."""
    yield
    if "twinkle_megatron" in sys.modules:
        from twinkle_megatron import cpu_compat

        cpu_compat.disable()
