"""The torch chunked fused linear cross-entropy against the plain materialised path.

fp32 tolerance: loss rtol 1e-5, gradients atol 1e-6 / rtol 1e-5 (only the summation order differs).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from twinkle.kernel import TensorMemoryTracker, fused_linear_cross_entropy

N, H, V = 50, 16, 300


def _inputs(bias: bool = False, dtype=torch.float32, n: int = N, h: int = H, v: int = V, ignore: float = 0.3):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.3).to(dtype).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.1).to(dtype).requires_grad_() if bias else None
    labels = torch.randint(0, v, (n,), generator=g)
    labels[torch.rand(n, generator=g) < ignore] = -100
    return hidden, weight, b, labels


def _materialised(hidden, weight, bias, labels, reduction, ignore_index=-100):
    logits = F.linear(hidden, weight, bias).float()
    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction=reduction), logits


def _grads(*tensors):
    return [t.grad.clone() for t in tensors if t is not None]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("chunk_size", [7, None, 1000])
def test_equal_loss_and_grads_to_materialised(reduction, bias, chunk_size):
    hidden, weight, b, labels = _inputs(bias)
    out = fused_linear_cross_entropy(hidden, weight, labels, b, reduction=reduction, chunk_size=chunk_size)
    (out.loss * 2.5).backward()  # an upstream gradient other than 1 must scale every gradient
    got = _grads(hidden, weight, b)

    ref_h, ref_w, ref_b, _ = _inputs(bias)
    ref, logits = _materialised(ref_h, ref_w, ref_b, labels, reduction)
    (ref * 2.5).backward()
    torch.testing.assert_close(out.loss, ref, rtol=1e-5, atol=1e-6)
    for g, r in zip(got, _grads(ref_h, ref_w, ref_b)):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)
    valid = labels != -100
    assert int(out.num_tokens) == int(valid.sum())
    assert int(out.num_correct) == int(((logits.argmax(-1) == labels) & valid).sum())


def test_ignored_rows_get_no_gradient_and_custom_ignore_index():
    hidden, weight, _, labels = _inputs()
    labels[labels == -100] = -1
    out = fused_linear_cross_entropy(hidden, weight, labels, ignore_index=-1, reduction="sum", chunk_size=8)
    out.loss.backward()
    ignored = labels == -1
    assert ignored.any() and (~ignored).any()
    assert torch.count_nonzero(hidden.grad[ignored]) == 0
    kept = F.cross_entropy(F.linear(hidden[~ignored].detach(), weight.detach()), labels[~ignored], reduction="sum")
    torch.testing.assert_close(out.loss, kept, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_all_ignored_batch_is_zero_not_nan(reduction):
    hidden, weight, _, labels = _inputs(ignore=1.1)
    assert (labels == -100).all()
    out = fused_linear_cross_entropy(hidden, weight, labels, reduction=reduction)
    out.loss.backward()
    assert out.loss.item() == 0.0 and int(out.num_tokens) == 0 and int(out.num_correct) == 0
    assert torch.count_nonzero(hidden.grad) == 0 and torch.count_nonzero(weight.grad) == 0
    # the plain path's mean is 0/0 here: the fused loss documents 0 instead
    assert torch.isnan(_materialised(hidden, weight, None, labels, "mean")[0])


def test_empty_input_rows():
    hidden, weight, _, labels = _inputs(n=0)
    out = fused_linear_cross_entropy(hidden, weight, labels)
    out.loss.backward()
    assert out.loss.item() == 0.0 and hidden.grad.shape == (0, H) and torch.count_nonzero(weight.grad) == 0


def test_never_materialises_the_logits_and_peaks_far_lower():
    n, v, chunk = 512, 2048, 64
    peaks = {}
    for name in ("materialised", "fused"):
        hidden, weight, _, labels = _inputs(n=n, h=32, v=v)
        with TensorMemoryTracker() as tracker:
            if name == "fused":
                loss = fused_linear_cross_entropy(hidden, weight, labels, chunk_size=chunk).loss
            else:
                loss = _materialised(hidden, weight, None, labels, "mean")[0]
            loss.backward()
        peaks[name] = tracker
    logits_bytes = n * v * 4
    assert peaks["materialised"].largest_bytes >= logits_bytes
    assert peaks["fused"].largest_bytes <= chunk * v * 4 < logits_bytes
    assert peaks["fused"].peak_bytes <= 0.3 * peaks["materialised"].peak_bytes, (
        peaks["fused"].peak_bytes, peaks["materialised"].peak_bytes)


def test_no_grad_gives_the_same_loss():
    hidden, weight, _, labels = _inputs()
    with torch.no_grad():
        out = fused_linear_cross_entropy(hidden, weight, labels, chunk_size=9)
    assert not out.loss.requires_grad
    torch.testing.assert_close(out.loss, _materialised(hidden, weight, None, labels, "mean")[0].detach(),
                               rtol=1e-5, atol=1e-6)


def test_bf16_inputs_stay_close_and_grads_keep_dtype():
    hidden, weight, _, labels = _inputs(dtype=torch.bfloat16)
    out = fused_linear_cross_entropy(hidden, weight, labels, chunk_size=16)
    out.loss.backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16
    ref_h, ref_w, _, _ = _inputs(dtype=torch.bfloat16)
    ref = _materialised(ref_h, ref_w, None, labels, "mean")[0]
    ref.backward()
    torch.testing.assert_close(out.loss, ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(hidden.grad.float(), ref_h.grad.float(), rtol=2e-2, atol=2e-3)


def test_a_second_backward_is_refused_and_shapes_are_checked():
    hidden, weight, _, labels = _inputs()
    loss = fused_linear_cross_entropy(hidden, weight, labels).loss
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="one backward"):
        loss.backward()
    with pytest.raises(ValueError, match="labels"):
        fused_linear_cross_entropy(hidden, weight, labels[:-1])
    with pytest.raises(ValueError, match="reduction"):
        fused_linear_cross_entropy(hidden, weight, labels, reduction="none")
