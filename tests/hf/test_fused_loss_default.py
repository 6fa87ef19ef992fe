"""The default training loss: the fused linear cross-entropy on CUDA with liger, the logits' CE elsewhere."""

from __future__ import annotations

import pytest
import torch
from hf_testing import make_batch, make_model
from rounding import tiny_hf, within

from twinkle_hf.model.transformers_model import fused_loss_by_default

# float32, the chunked loss against the materialised one: only the order of the sums over the vocabulary and the
# tokens differs (tests/rounding.py, 4 rows of 12 tokens, vocab 128): a step's bound on the loss and gradients
STEP = tiny_hf(12, 4).step_bound()


@pytest.mark.parametrize("flag,device,liger,fused", [
    (None, "cuda", True, True), (None, "cuda", False, False), (None, "cpu", True, False),
    (False, "cuda", True, False), (True, "cpu", False, True)])
def test_the_fused_loss_is_the_default_on_cuda_with_liger(flag, device, liger, fused):
    assert fused_loss_by_default(flag, device, liger) is fused


def test_the_cpu_default_keeps_the_logits_loss_and_the_fused_default_matches_it():
    """On the CPU nothing changes by default (the recorded numerics of the default path hold); the fused default
    (what CUDA gets) trains the same step within the reduction-order bound, and a set loss still wins."""
    default, fused = make_model(seed=0), make_model(seed=0, fused_loss=True)
    assert getattr(default.backend, "training_task", "causal_lm") == "causal_lm"
    assert fused.backend.training_task == "fused_lm_ce"
    for m in (default, fused):
        m.set_optimizer("SGD", lr=0.1)
    losses = [m.forward_backward(inputs=make_batch(1)) for m in (default, fused)]
    assert float(losses[1]) == pytest.approx(float(losses[0]), rel=STEP)
    grads = [[p.grad for p in m.model.parameters()] for m in (default, fused)]
    for g_fused, g_default in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(g_fused, g_default, **within(STEP, g_default))
    # the bound is far below what the step changes: the gradient is not small against it
    assert max(float(g.abs().max()) for g in grads[0]) > 1e3 * STEP
    assert fused.forward(inputs=make_batch(2)).logits.shape[-1] == 128  # forward still returns logits
