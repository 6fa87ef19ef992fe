"""Platform detection through the registry, including the npu platform contributed by twinkle-npu."""

from __future__ import annotations

import sys
import types

import pytest

from twinkle.platform import CPUPlatform, detect_platform, platforms
from twinkle.utils.framework import Torch


def test_cpu_is_detected_here(monkeypatch):
    monkeypatch.delenv("TWINKLE_DEVICE", raising=False)
    assert detect_platform() is CPUPlatform
    assert (CPUPlatform.device_type, CPUPlatform.dist_backend) == ("cpu", "gloo")
    assert str(CPUPlatform.device()) == "cpu"
    assert Torch.is_gpu_available() is False and Torch.device_type() == "cpu"


def test_npu_is_registered_by_twinkle_npu_and_unavailable_without_torch_npu():
    from twinkle_npu.platform import NPUPlatform

    assert platforms()["npu"] is NPUPlatform
    assert (NPUPlatform.dist_backend, NPUPlatform.device_type) == ("cpu:gloo,npu:hccl", "npu")
    assert "torch_npu" not in sys.modules
    assert NPUPlatform.is_available() is False and Torch.is_npu_available() is False
    with pytest.raises(RuntimeError, match="pip install torch-npu"):
        NPUPlatform.set_device(0)


def test_a_fake_available_npu_wins_by_priority(monkeypatch):
    """Pretend torch_npu is installed and sees 2 devices: detection must pick npu over cpu."""
    import torch

    fake_npu = types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 2, set_device=lambda i: None)
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "torch_npu" else None)
    monkeypatch.setattr(torch, "npu", fake_npu, raising=False)
    monkeypatch.delenv("TWINKLE_DEVICE", raising=False)
    assert detect_platform().name == "npu"
    assert Torch.is_npu_available() is True
    monkeypatch.setenv("TWINKLE_DEVICE", "cpu")
    assert detect_platform() is CPUPlatform


def test_forcing_an_unknown_or_unavailable_platform(monkeypatch):
    monkeypatch.setenv("TWINKLE_DEVICE", "tpu")
    with pytest.raises(LookupError, match="Unknown platform 'tpu'"):
        detect_platform()
    with pytest.raises(RuntimeError, match="'cuda' was requested .* Available: cpu"):
        detect_platform("cuda")
