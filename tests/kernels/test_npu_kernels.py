"""twinkle-npu's kernel choices with a fake Ascend stack (torch_npu in plain torch, see conftest)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch
from rounding import chain_bound, tiny_hf, within
from torch import nn

from twinkle.kernel import kernel_report, kernelize, unkernelize

#: float32's bounds for a forward and a training step of the batch fixture (2 rows of 10 tokens): tests/rounding.py
FWD, STEP = tiny_hf(10, 2).forward_bound(), tiny_hf(10, 2).step_bound()

NPU_OPS = ("rms_norm", "swiglu", "rotary_embedding", "attention")


def _forward_backward(model, batch, padded):
    model.zero_grad()
    kwargs = {"input_ids": batch["input_ids"]}
    if padded:
        kwargs["attention_mask"] = batch["attention_mask"]
    logits = model(**kwargs).logits
    keep = batch["attention_mask"].bool() if padded else torch.ones_like(batch["input_ids"], dtype=torch.bool)
    logits[keep].pow(2).mean().backward()  # padded query rows are undefined in every implementation
    return logits.detach()[keep], {n: p.grad.clone() for n, p in model.named_parameters()}


def test_npu_package_imports_without_torch_npu_and_reports_unavailable():
    code = (
        "import sys, json, importlib.util\n"
        "import twinkle_npu.plugin\n"
        "from twinkle_npu.kernels.choices import NPU_RMS_NORM, npu_available\n"
        "from twinkle_npu.platform import NPUPlatform\n"
        "print(json.dumps({'installed': importlib.util.find_spec('torch_npu') is not None,\n"
        "  'available': npu_available(), 'choice': NPU_RMS_NORM.is_available('npu'),\n"
        "  'platform': NPUPlatform.is_available(), 'backend': NPUPlatform.dist_backend,\n"
        "  'loaded': 'torch_npu' in sys.modules}))"
    )
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert out == {"installed": False, "available": False, "choice": False, "platform": False,
                   "backend": "cpu:gloo,npu:hccl", "loaded": False}


@pytest.mark.parametrize("attn,padded", [("sdpa", False), ("sdpa", True), ("eager", True)])
def test_default_chains_pick_npu_first_and_match_the_model(attn, padded, fake_npu, make_model, batch):
    model = make_model("qwen2", attn_implementation=attn)
    want_out, want_grads = _forward_backward(copy.deepcopy(model), batch, padded)

    kernelize(model, device="npu")
    report = kernel_report(model)
    for op in NPU_OPS:
        assert report.chosen(op) == [f"npu.{op}"], (op, report.ops[op])
    assert report.chosen("fused_linear_cross_entropy") == ["torch.fused_linear_cross_entropy"]  # liger: cuda only
    got_out, got_grads = _forward_backward(model, batch, padded)
    assert set(fake_npu) == {"npu_rms_norm", "npu_swiglu", "npu_rotary_mul", "npu_fusion_attention"}
    # tolerance: every kernel reimplemented in fp32 (the same sums in another order): the forward's and the
    # backward's float32 bound for the batch fixture's 2 rows of 10 tokens (tests/rounding.py)
    torch.testing.assert_close(got_out, want_out, **within(FWD, want_out))
    for name in want_grads:
        torch.testing.assert_close(got_grads[name], want_grads[name], **within(STEP, want_grads[name]))
    unkernelize(model)
    assert not any("forward" in vars(m) for m in model.modules())


def test_npu_choices_need_an_npu(fake_npu, make_model, monkeypatch):
    model = make_model("llama")
    kernelize(model)  # the fake NPU is there, but this model lives on the CPU
    assert kernel_report(model).chosen("rms_norm") == ["torch.rms_norm"] and not kernel_report(model).changed
    monkeypatch.setattr(torch.npu, "is_available", lambda: False)
    kernelize(model, device="npu")  # an npu device that torch_npu cannot see: everything falls to torch
    assert all(kernel_report(model).chosen(op) == [f"torch.{op}"] for op in NPU_OPS)
    assert fake_npu == {}


class OffsetRMSNorm(nn.Module):
    """Gemma-style RMSNorm: scales by (1 + weight)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(-0.5, 0.5, dim))
        self.eps = eps

    def forward(self, x):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


def test_npu_rms_norm_handles_the_gemma_offset(fake_npu):
    model = nn.Sequential(OffsetRMSNorm(16))
    x = torch.randn(3, 16)
    want = model(x)
    kernelize(model, device="npu")
    assert kernel_report(model).chosen("rms_norm") == ["npu.rms_norm"]
    # one RMSNorm: a mean of 16 squares, then elementwise (tests/rounding.py)
    torch.testing.assert_close(model(x), want, **within(chain_bound(16), want, terms=16))
    assert fake_npu == {"npu_rms_norm": 1}
    unkernelize(model)


def test_sliding_window_attention_falls_back_to_the_configured_implementation(fake_npu, make_model, batch):
    model = make_model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    ids = batch["input_ids"]
    want = copy.deepcopy(model)(input_ids=ids).logits
    kernelize(model, device="npu")
    assert kernel_report(model).chosen("attention") == ["npu.attention"]
    torch.testing.assert_close(model(input_ids=ids).logits, want, **within(FWD, want))  # as above
    assert "npu_fusion_attention" not in fake_npu and fake_npu["npu_rotary_mul"] > 0
    unkernelize(model)
