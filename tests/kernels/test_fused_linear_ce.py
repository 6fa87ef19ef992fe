"""The torch chunked fused linear cross-entropy against the plain materialised path.

Tolerance: the two paths compute the same sums in fp32 in different orders (chunks of rows, softmax
formed as exp(z - max) / sum instead of exp(log_softmax)), so they may differ by what fp32 rounding
allows, derived per element in :func:`_rounding_bounds` from the standard bound for a k-term
sum, |fl(sum) - sum| <= gamma_k * sum |terms| with gamma_k = k*u / (1 - k*u), u = 2**-24. The bound is
far below what a real mistake changes (a missing row, scale or sign is of the size of the terms).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from rounding import chain_bound

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


U = 2.0 ** -24  # fp32 unit roundoff


def _gamma(k: int) -> float:
    return k * U / (1 - k * U)


def _rounding_bounds(hidden, weight, bias, labels, reduction, scale):
    """Per-element bounds on |fused - materialised| for (loss, grad hidden, grad weight[, grad bias]) in fp32.

    Both paths round; each error below is counted once per path (the factor 2). logits z = h W^T + b
    (H-term sums); p = softmax(z) to relative error 2 max|dz| + gamma_V + 4u (exp, sum, division,
    and the shift by max z); g = p - onehot; dh = g W (V-term sums), dW = g^T h and db = sum g
    (N-term sums over trained rows); the loss sums lse - z_y over N rows.
    """
    h, w = hidden.detach().double(), weight.detach().double()
    valid = labels != -100
    h, y = h[valid], labels[valid]
    n, k = h.shape
    v = w.shape[0]
    z = h @ w.T + (bias.detach().double() if bias is not None else 0)
    p = torch.softmax(z, dim=-1)
    g = p.clone()
    g[torch.arange(n), y] -= 1
    dz = 2 * _gamma(k + 1) * (h.abs() @ w.abs().T + (bias.detach().double().abs() if bias is not None else 0))
    dp = p * (2 * dz.max(dim=-1, keepdim=True).values + _gamma(v) + 4 * U)  # |p_fused - p_plain|
    divisor = max(int(valid.sum()), 1) if reduction == "mean" else 1
    factor = abs(scale) / divisor
    grad_h = torch.zeros_like(hidden, dtype=torch.float64)
    grad_h[valid] = factor * (dp @ w.abs() + 2 * _gamma(v) * g.abs() @ w.abs()) + 2 * U * (g @ w).abs() * factor
    grad_w = factor * (dp.T @ h.abs() + 2 * _gamma(n) * g.abs().T @ h.abs()) + 2 * U * (g.T @ h).abs() * factor
    bounds = [grad_h, grad_w]
    if bias is not None:
        bounds.append(factor * (dp.sum(0) + 2 * _gamma(n) * g.abs().sum(0)) + 2 * U * g.sum(0).abs() * factor)
    lse_error = 2 * dz.max(dim=-1).values + _gamma(v) + 4 * U
    per_row = (torch.logsumexp(z, -1) - z[torch.arange(n), y]).abs()
    loss = (lse_error + dz[torch.arange(n), y]).sum() + 2 * _gamma(n) * per_row.sum()
    return loss / divisor, bounds


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
    loss_bound, grad_bounds = _rounding_bounds(ref_h, ref_w, ref_b, labels, reduction, scale=2.5)
    assert abs(float(out.loss) - float(ref)) <= float(loss_bound)
    for g, r, bound in zip(got, _grads(ref_h, ref_w, ref_b), grad_bounds):
        assert ((g.double() - r.double()).abs() <= bound).all(), float(((g - r).abs() - bound).max())
        assert bound.max() < 1e-3 * r.abs().max()  # tight enough that a real error could not hide in it
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
    # positive terms: an H-term logit, a log-sum-exp over V, a sum over N tokens, chunked (tests/rounding.py)
    torch.testing.assert_close(out.loss, kept, rtol=chain_bound(H, V, N), atol=0)


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
    # positive terms: an H-term logit, a log-sum-exp over V, a mean over N tokens, chunked (tests/rounding.py)
    torch.testing.assert_close(out.loss, _materialised(hidden, weight, None, labels, "mean")[0].detach(),
                               rtol=chain_bound(H, V, N), atol=0)


def test_bf16_inputs_stay_close_and_grads_keep_dtype():
    hidden, weight, _, labels = _inputs(dtype=torch.bfloat16)
    out = fused_linear_cross_entropy(hidden, weight, labels, chunk_size=16)
    out.loss.backward()
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.bfloat16
    ref_h, ref_w, _, _ = _inputs(dtype=torch.bfloat16)
    ref = _materialised(ref_h, ref_w, None, labels, "mean")[0]
    ref.backward()
    # measured, kept: both sides bfloat16 (u = 2**-8), chunked vs materialised; a bf16 bound (~0.1 relative
    # over these sums) could not fail, so the tolerance is a few bf16 ulps of the loss and gradients
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
