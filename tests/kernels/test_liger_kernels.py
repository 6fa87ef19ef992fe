"""liger choices: cuda-only selection and wiring tested on CPU for real; liger's numerics marked gpu."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import torch
from rounding import chain_bound, tiny_hf, within

from twinkle.kernel import kernel_report, kernelize, select_choice, unkernelize
from twinkle.kernel.choice import load_ref
from twinkle_hf.plugin import register_kernels

LIGER_INSTALLED = importlib.util.find_spec("liger_kernel") is not None
LIGER_OPS = ("rms_norm", "swiglu", "rotary_embedding", "fused_linear_cross_entropy")
CHOICES = [load_ref(ref) for ref in register_kernels().values()]  # what twinkle-hf registers
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch says a CUDA device exists (the tensors stay on the CPU)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def test_liger_choices_are_cuda_only_and_unavailable_without_cuda():
    assert {c.op for c in CHOICES} == set(LIGER_OPS)
    for choice in CHOICES:
        assert choice.devices == ("cuda",) and choice.provider == "liger"
        assert not choice.is_available("cpu") and not choice.is_available("npu")
        assert choice.is_available("cuda") == (torch.cuda.is_available() and LIGER_INSTALLED)


def test_on_cuda_liger_comes_first_and_without_liger_torch_does(fake_cuda, make_model, monkeypatch):
    model = make_model("qwen2")
    norm, mlp, attn = model.model.norm, model.model.layers[0].mlp, model.model.layers[0].self_attn
    expected = "liger" if LIGER_INSTALLED else "torch"
    assert select_choice("rms_norm", "cuda", module=norm).provider == expected
    assert select_choice("swiglu", "cuda", module=mlp).provider == expected
    assert select_choice("rotary_embedding", "cuda", module=attn).provider == expected
    assert select_choice("fused_linear_cross_entropy", "cuda").provider == expected
    assert select_choice("attention", "cuda", module=attn).name == "torch.attention"  # liger has none

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "liger_kernel" else real(name, *a))
    assert select_choice("rms_norm", "cuda", module=norm).name == "torch.rms_norm"
    assert select_choice("fused_linear_cross_entropy", "cuda").name == "torch.fused_linear_cross_entropy"


def test_kernelize_on_cuda_wires_the_liger_kernels(fake_cuda, make_model, batch):
    model = make_model("qwen2")
    want = copy.deepcopy(model)(input_ids=batch["input_ids"]).logits
    kernelize(model, device="cuda")
    report = kernel_report(model)
    provider = "liger" if LIGER_INSTALLED else "torch"
    for op in ("rms_norm", "swiglu", "rotary_embedding"):
        assert report.chosen(op) == [f"{provider}.{op}"]
    assert report.ops["rms_norm"].modules == {f"{provider}.rms_norm": 5}
    if LIGER_INSTALLED:  # CPU tensors reach liger's triton kernels, which find no usable GPU driver here
        with pytest.raises(Exception) as failure:
            model(input_ids=batch["input_ids"])
        assert any("liger_kernel" in str(entry.path) for entry in failure.traceback), failure.getrepr()
    unkernelize(model)
    assert torch.equal(model(input_ids=batch["input_ids"]).logits, want)


def test_default_config_on_cpu_never_picks_liger(make_model, fake_cuda):
    model = make_model("llama")
    kernelize(model)  # cuda "exists", but the model is on the CPU
    report = kernel_report(model)
    assert not report.changed
    assert all(not name.startswith("liger") for op in report.ops for name in report.chosen(op))


# ----------------------------------------------------------------------------- GPU machine only
@pytest.mark.gpu
@needs_cuda
def test_liger_kernels_match_the_model_on_cuda(make_model, batch):
    model = make_model("qwen2").cuda()
    reference = copy.deepcopy(model)
    ids = batch["input_ids"].cuda()
    outs = []
    for m in (reference, kernelize(model)):
        logits = m(input_ids=ids).logits
        logits.pow(2).mean().backward()
        outs.append((logits.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}))
    report = kernel_report(model)
    assert report.chosen("rms_norm") == ["liger.rms_norm"] and report.chosen("swiglu") == ["liger.swiglu"]
    assert report.chosen("rotary_embedding") == ["liger.rotary_embedding"]
    # tolerance (fp32, triton vs torch: the same sums in another order): the forward's and the backward's bound
    # for 2 rows of 10 tokens (tests/rounding.py), elementwise as rounding.within scales it
    torch.testing.assert_close(outs[1][0], outs[0][0], **within(tiny_hf(10, 2).forward_bound(), outs[0][0]))
    for name, grad in outs[0][1].items():
        torch.testing.assert_close(outs[1][1][name], grad, **within(tiny_hf(10, 2).step_bound(), grad))


@pytest.mark.gpu
@needs_cuda
def test_liger_fused_linear_ce_matches_materialised_on_cuda():
    from twinkle_hf.kernels.liger_ops import fused_linear_cross_entropy

    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(300, 64, generator=g).cuda().requires_grad_()
    weight = (torch.randn(1000, 64, generator=g) * 0.2).cuda().requires_grad_()
    labels = torch.randint(0, 1000, (300,), generator=g).cuda()
    labels[::3] = -100
    out = fused_linear_cross_entropy(hidden, weight, labels, reduction="mean")
    out.loss.backward()
    ref_h, ref_w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    logits = ref_h @ ref_w.T
    ref = torch.nn.functional.cross_entropy(logits, labels)
    ref.backward()
    # fp32 in another order: logits sum 64 terms, the softmax 1000, a hidden gradient 1000, a weight's 300 tokens
    bound = chain_bound(64, 1000, 1000, 300)
    torch.testing.assert_close(out.loss, ref, rtol=bound, atol=0)
    torch.testing.assert_close(hidden.grad, ref_h.grad, **within(bound, ref_h.grad, terms=1000))
    torch.testing.assert_close(weight.grad, ref_w.grad, **within(bound, ref_w.grad, terms=1000))
    valid = labels != -100
    assert int(out.num_correct) == int(((logits.argmax(-1) == labels) & valid).sum())
