"""The probes that keep a kernel from replacing code with different semantics."""

from __future__ import annotations

import torch
from torch import nn

from twinkle.kernel import KernelChoice, kernel_report, kernelize, unkernelize
from twinkle.kernel.probes import is_standard_rotary, reference_rotary, rms_norm_spec


class OffsetRMSNorm(nn.Module):
    """Gemma-style: scales by (1 + weight)."""

    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(-0.5, 0.5, dim))
        self.eps = eps

    def forward(self, x):
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class CenteredRMSNorm(OffsetRMSNorm):
    """Named like an RMSNorm but subtracts the mean first: no rms_norm kernel may take it."""

    def forward(self, x):
        return super().forward(x - x.mean(-1, keepdim=True))


class GeluMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = nn.Linear(4, 8), nn.Linear(4, 8), nn.Linear(8, 4)
        self.act_fn = nn.GELU()


def test_rms_norm_probe_finds_offset_and_rejects_other_formulas(make_model):
    model = make_model("qwen2")
    assert rms_norm_spec(model.model.norm).offset == 0.0
    assert rms_norm_spec(model.model.norm).eps == model.config.rms_norm_eps
    assert rms_norm_spec(OffsetRMSNorm(8)).offset == 1.0
    assert rms_norm_spec(CenteredRMSNorm(8)) is None
    assert rms_norm_spec(nn.RMSNorm(8)) is None  # eps=None: the kernels need a number


def test_rotary_probe():
    assert is_standard_rotary(reference_rotary)
    assert not is_standard_rotary(lambda q, k, cos, sin: (q * cos, k * cos))

    def full_head_only(q, k, cos, sin):  # partial widths must pass the rest through, not fail silently
        return reference_rotary(q[..., : cos.shape[-1]], k[..., : cos.shape[-1]], cos, sin)

    assert not is_standard_rotary(full_head_only)


def test_gelu_mlp_is_not_a_swiglu():
    seen = []
    choice = KernelChoice("test", "swiglu", devices=("cpu",), forward=lambda self, x: seen.append(x))
    model = nn.Sequential(GeluMLP())
    kernelize(model, {"swiglu": choice})
    assert kernel_report(model).ops["swiglu"].modules == {}
    unkernelize(model)
