"""LigerFusedLinearCrossEntropyLoss: same loss, grads and token counts as CrossEntropyLoss on logits;
falls back from a failing kernel to the torch chunked one."""

from __future__ import annotations

import importlib.util
import logging

import pytest
import torch
from rounding import chain_bound, tiny_hf, within

from twinkle.kernel import KernelChoice, KernelNotApplicable
from twinkle.loss import CrossEntropyLoss, Loss
from twinkle.metric import TokenAccuracy
from twinkle.registry import resolve
from twinkle_hf.kernels.fused_ce_loss import LigerFusedLinearCrossEntropyLoss, fused_ce_outputs

#: the batch fixture: 2 rows of 10 tokens; the LM head sums hidden (64) terms, the log-sum-exp the vocabulary,
#: the loss the tokens
LOSS = chain_bound(64, 128, 20)  # vocabulary 96, counted as 128
STEP = tiny_hf(10, 2).step_bound()

LIGER_ON_CPU = KernelChoice("liger", "fused_linear_cross_entropy", devices=("cpu",),
                            function="twinkle_hf.kernels.liger_ops:fused_linear_cross_entropy")


@pytest.fixture
def warnings_log(caplog):
    logger = logging.getLogger("twinkle")
    logger.addHandler(caplog.handler)
    yield caplog
    logger.removeHandler(caplog.handler)


def _plain(model, batch):
    model.zero_grad()
    outputs = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    total, items = CrossEntropyLoss().compute(batch, outputs)
    total.backward()
    metric = TokenAccuracy()
    metric.update(batch, outputs)
    return total.detach(), items, {n: p.grad.clone() for n, p in model.named_parameters()}, metric


def _fused(model, batch, loss):
    model.zero_grad()
    hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    total, items = loss.compute(batch, fused_ce_outputs(hidden, model.lm_head))
    total.backward()
    return total.detach(), items, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_resolvable_by_name_with_reduction_sum():
    loss = resolve("loss", "LigerFusedLinearCrossEntropyLoss")(reduction="sum")
    assert isinstance(loss, Loss) and loss.reduction == "sum"
    assert [c.name for c in loss.chain] == ["liger.fused_linear_cross_entropy", "torch.fused_linear_cross_entropy"]


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_same_loss_grads_and_accuracy_as_cross_entropy_on_logits(kind, make_model, batch, warnings_log):
    warnings_log.set_level(logging.INFO, logger="twinkle")
    model = make_model(kind, tie_word_embeddings=(kind == "llama"))
    want_total, want_items, want_grads, metric = _plain(model, batch)
    loss = LigerFusedLinearCrossEntropyLoss(reduction="sum", chunk_size=5)
    total, items, grads = _fused(model, batch, loss)
    # tolerance (fp32): the same hidden states, then the head and the loss in another order (LOSS: a sum of
    # positive terms); the gradients carry that through the backward (STEP) (tests/rounding.py)
    torch.testing.assert_close(total, want_total, rtol=LOSS, atol=0)
    assert int(items) == int(want_items)
    assert set(grads) == set(want_grads)
    for name, grad in want_grads.items():
        torch.testing.assert_close(grads[name], grad, **within(STEP, grad))
    correct, tokens = loss.last_token_counts
    # integer counts: approx (1e-6) absorbs only float32 against float64 division of the same counts
    assert float(correct) / float(tokens) == pytest.approx(metric.compute()["token_accuracy"])
    assert loss.last_choice == "torch.fused_linear_cross_entropy"
    assert any("using torch.fused_linear_cross_entropy on cpu (liger.fused_linear_cross_entropy not available"
               in r.getMessage() for r in warnings_log.records)
    mean = loss.__class__(reduction="mean")(batch, fused_ce_outputs(_hidden(model, batch)["last_hidden_state"],
                                                                    model.lm_head))["loss"]
    torch.testing.assert_close(mean, want_total / want_items, rtol=LOSS, atol=0)


def _hidden(model, batch):
    out = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return {"last_hidden_state": out.last_hidden_state}


def test_a_failing_kernel_falls_back_once_and_stays_on_the_fallback(make_model, batch, warnings_log):
    model = make_model("qwen2")
    want = _plain(model, batch)[0]
    loss = LigerFusedLinearCrossEntropyLoss(reduction="sum", chain=[LIGER_ON_CPU, "torch.fused_linear_cross_entropy"])
    for _ in range(2):
        total = _fused(model, batch, loss)[0]
        torch.testing.assert_close(total, want, rtol=LOSS, atol=0)
    assert list(loss.failed) == ["liger.fused_linear_cross_entropy"]
    if importlib.util.find_spec("liger_kernel") is not None:
        assert "active drivers" in loss.failed["liger.fused_linear_cross_entropy"]  # the real liger, no GPU
    else:
        assert "liger_kernel" in loss.failed["liger.fused_linear_cross_entropy"]
    falling = [r for r in warnings_log.records if "falling back to torch.fused_linear_cross_entropy" in r.getMessage()]
    assert len(falling) == 1 and falling[0].levelno == logging.WARNING


def rejects_every_shape(*args, **kwargs):
    raise KernelNotApplicable("vocab not a multiple of 128")


def test_a_shape_rejection_falls_back_and_the_last_choice_error_surfaces(make_model, batch):
    model = make_model("qwen2")
    picky = KernelChoice("picky", "fused_linear_cross_entropy", devices=("cpu",), function=rejects_every_shape)
    loss = LigerFusedLinearCrossEntropyLoss(chain=[picky, "torch.fused_linear_cross_entropy"])
    torch.testing.assert_close(_fused(model, batch, loss)[0], _plain(model, batch)[0], rtol=LOSS, atol=0)
    alone = LigerFusedLinearCrossEntropyLoss(chain=[picky])
    with pytest.raises(KernelNotApplicable):
        _fused(model, batch, alone)


def test_contract_errors_name_the_task_and_all_ignored_batches_are_zero(make_model, batch):
    model = make_model("qwen2")
    loss = LigerFusedLinearCrossEntropyLoss()
    logits_only = {"logits": model(input_ids=batch["input_ids"]).logits}
    with pytest.raises(KeyError, match="task='fused_lm_ce'.*last_hidden_state"):
        loss.compute(batch, logits_only)
    with pytest.raises(KeyError, match="labels"):
        loss.compute({"input_ids": batch["input_ids"]}, _hidden(model, batch) | {"lm_head": model.lm_head})
    ignored = {**batch, "labels": torch.full_like(batch["labels"], -100)}
    total, items = loss.compute(ignored, _hidden(model, batch) | {"lm_head": model.lm_head})
    assert total.item() == 0.0 and int(items) == 0
    assert loss(ignored, _hidden(model, batch) | {"lm_head": model.lm_head})["loss"].item() == 0.0
