"""Fused linear + cross-entropy in plain torch: the (N, V) logits are never materialised.

The positions are processed in fixed chunks of ``chunk_size`` rows. For each chunk the forward
computes the chunk's logits, its loss and arg-max hits and — when gradients are needed — the
chunk's gradient right away (softmax minus one-hot, written over the logits buffer), folding it
into the hidden and weight gradients; rows labelled ``ignore_index`` are masked out of all of them.
Backward then only scales those by the incoming gradient. This is the liger-kernel recipe in torch:
the FLOPs of the plain path, with peak extra memory of one chunk of logits plus the gradients the
plain path produces anyway. Nothing is read back to the host: the chunks depend on shapes only, so
on an accelerator no micro-batch waits for the device (skipping the ignored rows would need their
count on the host — a sync per call).
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle.constants import IGNORE_INDEX
from twinkle.kernel.cross_entropy import FusedCEOutput, check_reduction

#: default chunk: about this many logits elements (2**26 fp32 = 256 MiB) per chunk
DEFAULT_CHUNK_ELEMENTS = 1 << 26


def default_chunk_size(num_tokens: int, vocab_size: int) -> int:
    """Rows per chunk so that one chunk of fp32 logits stays near DEFAULT_CHUNK_ELEMENTS."""
    return max(1, min(max(num_tokens, 1), DEFAULT_CHUNK_ELEMENTS // max(vocab_size, 1)))


def _chunked(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, bias: torch.Tensor | None,
             ignore_index: int, chunk_size: int, grads: tuple[bool, bool, bool]) -> tuple[Any, ...]:
    """Loss sum, correct count, token count and the unscaled (sum-reduction) gradients.

    Every row is multiplied; an ignored row's loss, hit and gradient are masked to zero (its label
    replaced by 0 only to index safely). Per chunk: one pass for max/arg-max, one for the shift, one
    exp, one sum, and (with gradients) one division — softmax is built in the logits buffer and
    turned into the logits gradient in place.
    """
    need_h, need_w, need_b = grads
    n, v = hidden.shape[0], weight.shape[0]
    valid = labels != ignore_index
    safe_labels = labels.masked_fill(~valid, 0)
    loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
    correct = torch.zeros((), dtype=torch.int64, device=hidden.device)
    grad_h = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) if need_h else None
    grad_w = torch.zeros(v, weight.shape[1], dtype=torch.float32, device=weight.device) if need_w else None
    grad_b = torch.zeros(v, dtype=torch.float32, device=weight.device) if need_b else None
    for start in range(0, n, chunk_size):
        end = min(start + chunk_size, n)
        h, y, keep = hidden[start:end], safe_labels[start:end].unsqueeze(1), valid[start:end]
        logits = (torch.addmm(bias, h, weight.t()) if bias is not None else h @ weight.t()).float()
        top, predicted = logits.max(dim=-1)
        correct += ((predicted == y.squeeze(1)) & keep).sum()
        logits.sub_(top.unsqueeze(1))
        target = logits.gather(1, y).squeeze(1)
        total = logits.exp_().sum(dim=-1)
        loss += torch.where(keep, total.log() - target, 0.0).sum()
        if not (need_h or need_w or need_b):
            continue
        grad = logits.div_(total.unsqueeze(1))  # softmax
        grad.scatter_add_(1, y, torch.full(y.shape, -1.0, dtype=grad.dtype, device=grad.device))
        grad.masked_fill_(~keep.unsqueeze(1), 0.0)  # ignored rows: no gradient
        g = grad.to(hidden.dtype)
        if need_h:
            torch.mm(g, weight, out=grad_h[start:end])
        if need_w:
            if g.dtype == torch.float32:
                grad_w.addmm_(g.t(), h)
            else:
                grad_w += (g.t() @ h).float()
        if need_b:
            grad_b += grad.sum(0)
        del logits, grad, g
    return loss, correct, valid.sum(), grad_h, grad_w, grad_b


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Gradients are computed in forward (see module docstring); backward scales and returns them."""

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                bias: torch.Tensor | None, ignore_index: int, reduction: str, chunk_size: int,
                grads: tuple[bool, bool, bool]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        loss, correct, tokens, grad_h, grad_w, grad_b = _chunked(hidden, weight, labels, bias, ignore_index,
                                                                 chunk_size, grads)
        if reduction == "mean":
            divisor = tokens.clamp(min=1)
            loss = loss / divisor
            for g in (grad_h, grad_w, grad_b):
                if g is not None:
                    g.div_(divisor)
        ctx.grads = (grad_h, grad_w, grad_b)
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.mark_non_differentiable(correct, tokens)
        return loss, correct, tokens

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor, *_: Any) -> tuple[Any, ...]:
        if ctx.grads is None:
            raise RuntimeError("fused_linear_cross_entropy keeps its gradients for one backward only "
                               "(retain_graph=True is not supported).")
        out = []
        for g, dtype in zip(ctx.grads, ctx.dtypes):
            out.append(None if g is None else g.mul_(grad_loss.to(g.dtype)).to(dtype))
        ctx.grads = None
        return out[0], out[1], None, out[2], None, None, None, None


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                               bias: torch.Tensor | None = None, *, ignore_index: int = IGNORE_INDEX,
                               reduction: str = "mean", chunk_size: int | None = None) -> FusedCEOutput:
    """Cross-entropy of ``hidden @ weight.T (+ bias)`` against ``labels`` without building the logits.

    ``hidden`` (N, H) — or (..., H), flattened — ``weight`` (V, H), ``bias`` (V,), ``labels`` (N,)
    with ``ignore_index`` for untrained positions (no shifting here: the caller aligns them).
    Returns :class:`FusedCEOutput`; the loss is differentiable w.r.t. hidden, weight and bias.
    Matches ``F.cross_entropy(hidden @ weight.T + bias, labels)`` (fp32: |Δloss| ≤ 1e-5 relative,
    grads within 1e-5 absolute in the tests); an all-ignored batch gives loss 0 and zero grads.
    """
    check_reduction(reduction)
    if hasattr(weight, "full_tensor"):  # a DTensor shard (FSDP2): gather it (autograd-aware)
        weight = weight.full_tensor()
    if bias is not None and hasattr(bias, "full_tensor"):
        bias = bias.full_tensor()
    hidden = hidden.reshape(-1, hidden.shape[-1])
    labels = labels.reshape(-1).to(hidden.device)
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[1]:
        raise ValueError(f"weight must be (vocab, {hidden.shape[1]}) to match hidden; got {tuple(weight.shape)}.")
    if labels.numel() != hidden.shape[0]:
        raise ValueError(f"{labels.numel()} labels for {hidden.shape[0]} hidden rows; they must match "
                         "(shift them before calling).")
    dtype = torch.promote_types(hidden.dtype, weight.dtype)
    hidden, weight = hidden.to(dtype), weight.to(dtype)
    bias = bias.to(dtype) if bias is not None else None
    chunk = chunk_size if chunk_size is not None else default_chunk_size(hidden.shape[0], weight.shape[0])
    if chunk < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk}.")
    enabled = torch.is_grad_enabled()
    grads = (enabled and hidden.requires_grad, enabled and weight.requires_grad,
             enabled and bias is not None and bias.requires_grad)
    loss, correct, tokens = _ChunkedLinearCrossEntropy.apply(hidden, weight, labels, bias, ignore_index,
                                                             reduction, chunk, grads)
    return FusedCEOutput(loss, correct, tokens)
