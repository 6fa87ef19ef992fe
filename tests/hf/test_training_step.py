"""One training step of TransformersModel against plain transformers + torch doing the same by hand."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_testing import make_batch, make_model
from rounding import U, tiny_hf


def _plain_step(hf_model, batch, lr=1e-2, max_norm=1.0):
    """The reference: HF's own loss (labels passed in), backward, clip, AdamW step."""
    model = copy.deepcopy(hf_model).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, eps=1.0)  # Lipschitz in the gradient: see below
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    out.loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    optimizer.step()
    return float(out.loss.detach()), float(norm), model


def test_forward_matches_plain_transformers() -> None:
    model = make_model()
    batch = make_batch(0)
    reference = copy.deepcopy(model.model).eval()
    out = model.forward_only(inputs=batch)
    with torch.no_grad():
        expected = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(out.logits, expected, rtol=0, atol=0)


def test_full_step_matches_hand_written_loop() -> None:
    model = make_model()
    batch = make_batch(1)
    ref_loss, ref_norm, ref_model = _plain_step(model.model, batch)
    model.set_optimizer("AdamW", lr=1e-2, eps=1.0)
    loss = model.forward_backward(inputs=batch)
    norm = model.clip_grad_norm(1.0)
    model.step()
    model.zero_grad()
    # twinkle's token-mean loss and HF's sum in other orders: a forward's and a step's float32 bound (4 rows of 12
    # tokens, tests/rounding.py). One AdamW step with eps = 1 moves a weight by lr g / (|g| + 1), whose slope in g
    # is at most lr: the gradients' difference (rounding.within's, of the largest gradient, at most the clipped
    # norm 1) times lr, plus u |w| (eps = 1e-8 would make the step lr * sign(g): a near-zero g's rounding flips it)
    fwd, step = tiny_hf(12, 4).forward_bound(), tiny_hf(12, 4).step_bound()
    assert loss == pytest.approx(ref_loss, rel=fwd)
    assert norm == pytest.approx(ref_norm, rel=step)
    for (name, p), (_, q) in zip(model.model.named_parameters(), ref_model.named_parameters()):
        torch.testing.assert_close(p, q, rtol=2 * U, atol=1e-2 * step * (1 + 128**0.5), msg=name)  # 2 U: one ulp apart
    assert all(p.grad is None for p in model.model.parameters())
    assert model.optimizer_group["default"].cur_step == 1


def test_separate_calls_equal_forward_backward() -> None:
    batch = make_batch(2)
    a, b = make_model(seed=3), make_model(seed=3)
    for m in (a, b):
        m.set_optimizer("AdamW", lr=1e-2)
    loss_a = a.forward_backward(inputs=batch)
    b.forward(inputs=batch)
    loss_b = b.calculate_loss()
    b.backward()
    assert loss_a == loss_b
    a.clip_grad_and_step()
    b.clip_grad_and_step()
    for p, q in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(p, q)


def test_steps_are_noops_between_boundaries() -> None:
    model = make_model()
    model.set_optimizer("SGD", lr=0.1)
    model.set_lr_scheduler("StepLR", step_size=1, gamma=0.5)
    group = model.optimizer_group["default"]
    before = [p.detach().clone() for p in model.model.parameters()]
    model.forward_backward(inputs=make_batch(0), gradient_accumulation_steps=3)
    assert model.clip_grad_norm(1.0) is None
    model.step()
    model.zero_grad()
    model.lr_step()
    assert all(torch.equal(p, q) for p, q in zip(model.model.parameters(), before))
    assert any(p.grad is not None for p in model.model.parameters())  # kept for the next micro-batch
    assert group.cur_step == 0 and group.micro_step == 1
    assert group.optimizer.param_groups[0]["lr"] == 0.1
    model.forward_backward(inputs=make_batch(1))
    model.forward_backward(inputs=make_batch(2))
    model.clip_grad_and_step()
    assert group.cur_step == 1 and group.micro_step == 0
    assert group.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)  # Python floats: a scheduler's few 1e-17
    assert not all(torch.equal(p, q) for p, q in zip(model.model.parameters(), before))


def test_metrics_are_numbers() -> None:
    model = make_model()
    model.set_optimizer("AdamW", lr=1e-3)
    model.set_lr_scheduler("LinearWarmupScheduler", num_warmup_steps=2, num_training_steps=10)
    batch = make_batch(4)
    loss = model.forward_backward(inputs=batch)
    model.clip_grad_and_step()
    metrics = model.calculate_metric(is_training=True)
    assert set(metrics) == {"loss", "token_accuracy", "grad_norm", "lr", "tokens_per_second", "step", "skipped_steps"}
    assert all(isinstance(v, (int, float)) for v in metrics.values())
    # the same float32 loss read back (approx's 1e-6 holds its float32 rounding, 6e-8); lr: Python floats
    assert metrics["loss"] == pytest.approx(loss)
    assert metrics["step"] == 1 and metrics["lr"] == pytest.approx(1e-3 * 1 / 2) and metrics["skipped_steps"] == 0
    assert metrics["tokens_per_second"] > 0
    # accuracy against a by-hand count on the same forward
    with torch.no_grad():
        logits = model.forward_only(inputs=batch).logits
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    expected = ((logits[:, :-1].argmax(-1) == labels) & mask).sum().item() / mask.sum().item()
    model.calculate_loss()
    evaluation = model.calculate_metric(is_training=False)
    assert evaluation["token_accuracy"] == pytest.approx(expected)  # a ratio of the same integer counts
    assert "grad_norm" not in evaluation and "lr" not in evaluation
    again = model.calculate_metric(is_training=True)  # accumulators reset after reading; state numbers stay
    assert set(again) == {"grad_norm", "lr", "step", "skipped_steps"}


def test_forward_accepts_encoded_rows() -> None:
    """A list of encoded rows (what the DataLoader yields) trains exactly like the collated dict."""
    batch = make_batch(5, rows=3)
    rows = []
    for r in range(3):
        n = int(batch["attention_mask"][r].sum())
        rows.append({"input_ids": batch["input_ids"][r, :n].tolist(), "labels": batch["labels"][r, :n].tolist(),
                     "attention_mask": [1] * n, "position_ids": list(range(n)), "length": n})
    a, b = make_model(seed=1), make_model(seed=1)
    loss_rows = a.forward_backward(inputs=rows)
    width = max(r["length"] for r in rows)
    collated = {k: batch[k][:, :width] for k in ("input_ids", "attention_mask", "labels")}
    collated["position_ids"] = torch.arange(width).expand(3, width)
    loss_dict = b.forward_backward(inputs=collated)
    assert loss_rows == loss_dict  # exact: the rows collate to the dict's tensors, the same operations follow
