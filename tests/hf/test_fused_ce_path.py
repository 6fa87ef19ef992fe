"""task='fused_lm_ce': same loss, gradients and metrics as the materialised path, chosen from the loss."""

from __future__ import annotations

import pytest
import torch
from hf_testing import make_batch, make_model
from rounding import chain_bound, tiny_hf, within

LOSS, STEP = chain_bound(64, 128, 48), tiny_hf(12, 4).step_bound()


def _run(fused: bool):
    model = make_model("qwen2", seed=3)
    if fused:
        model.set_loss("LigerFusedLinearCrossEntropyLoss")
    batch = make_batch(seed=11)
    loss = model.forward_backward(inputs=batch)  # no task=: the loss decides
    grads = {n: p.grad.clone() for n, p in model.model.named_parameters() if p.grad is not None}
    train = model.calculate_metric(is_training=True)
    model.forward_only(inputs=make_batch(seed=12))
    eval_loss = model.calculate_loss()
    evaluation = model.calculate_metric(is_training=False)
    return loss, grads, train, eval_loss, evaluation, model


def test_fused_path_matches_the_materialised_one_and_reports_token_accuracy():
    plain = _run(fused=False)
    fused = _run(fused=True)
    assert fused[5].optimizer_group["default"].last_task == "fused_lm_ce"
    assert plain[5].optimizer_group["default"].last_task == "causal_lm"
    # the same hidden states, the head and the loss in another order (LOSS); the gradients carry that through the
    # backward (a step's bound), 4 rows of 12 tokens (tests/rounding.py)
    assert fused[0] == pytest.approx(plain[0], rel=LOSS)
    assert fused[1].keys() == plain[1].keys()
    for name in plain[1]:
        torch.testing.assert_close(fused[1][name], plain[1][name], **within(STEP, plain[1][name]))
    for metrics in (2, 4):  # training metrics, evaluation metrics
        # integer counts: approx's 1e-6 absorbs only float32 against float64 division
        assert fused[metrics]["token_accuracy"] == pytest.approx(plain[metrics]["token_accuracy"])
        assert fused[metrics]["loss"] == pytest.approx(plain[metrics]["loss"], rel=LOSS)
    assert fused[3] == pytest.approx(plain[3], rel=LOSS)
