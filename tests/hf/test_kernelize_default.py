"""TransformersModel's ``kernelize``: on by default on CUDA (without FSDP2), off elsewhere, numerics kept."""

from __future__ import annotations

import pytest
from hf_testing import make_batch, make_model

from twinkle.kernel import kernel_report
from twinkle_hf.model.transformers_model import kernelize_by_default


@pytest.mark.parametrize("flag,device,sharded,expected", [
    (None, "cuda", False, True), (None, "cuda", True, False), (None, "cpu", False, False), (None, "npu", False, False),
    (False, "cuda", False, False), (True, "cpu", False, True), (True, "cuda", True, True)])
def test_kernelize_is_on_by_default_on_cuda_only(flag, device, sharded, expected) -> None:
    assert kernelize_by_default(flag, device, sharded) is expected


def _losses(model, steps: int = 3) -> list[float]:
    model.set_optimizer("SGD", lr=0.5)
    batch, losses = make_batch(4), []
    for _ in range(steps):
        losses.append(float(model.forward_backward(inputs=batch)))
        model.clip_grad_and_step()
    return losses


def test_kernelize_true_on_the_cpu_chooses_torchs_own_ops_and_changes_nothing() -> None:
    """On the CPU every op's first available choice is torch's own (liger's are CUDA-only): kernelize runs,
    replaces nothing, and the model trains exactly as the plain one in this process. Liger's numerics against
    the plain model are checked on the GPU (tests/gpu/test_hf_gpu.py)."""
    assert kernel_report(make_model(seed=6)) is None  # the CPU default: not kernelized at all
    kernelized = make_model(seed=6, kernelize=True)
    report = kernel_report(kernelized)
    assert report is not None and report.chosen("rms_norm") == ["torch.rms_norm"] and not report.changed
    assert _losses(kernelized) == _losses(make_model(seed=6))
