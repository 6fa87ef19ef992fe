"""Gradient accumulation: N micro-batches make exactly the update of one token-weighted big batch."""

from __future__ import annotations

import pytest
import torch
from hf_testing import concat_batches, make_batch, make_model
from peft import LoraConfig
from rounding import U, tiny_hf


def _micro_batches() -> list[dict[str, torch.Tensor]]:
    # different widths, row counts and trained-token counts, so a plain average of means would be wrong
    return [make_batch(10, rows=2, length=9), make_batch(11, rows=3, length=14), make_batch(12, rows=2, length=7)]


def _train(model, batches, accumulation, optimizer="SGD", **opt_kwargs):
    model.set_optimizer(optimizer, **opt_kwargs)
    norms = []
    for batch in batches:
        model.forward_backward(inputs=batch, gradient_accumulation_steps=accumulation)
        norms.append(model.clip_grad_norm(100.0))
        model.step()
        model.zero_grad()
        model.lr_step()
    return norms


def _weights(model, adapter: str | None = None):
    return {k: v.detach().clone() for k, v in model.get_state_dict(adapter_name=adapter).items()}


# AdamW's first step is ~lr*sign(grad): a large eps keeps it a smooth function of the gradient, so
# fp32 rounding differences between the two summation orders stay at rounding size: the first step
# lr g / (|g| + eps) has slope at most lr / eps in g (1 here; SGD's is lr = 0.1). The gradients differ within a
# step's float32 bound for 7 rows of at most 14 tokens (tests/rounding.py), elementwise as rounding.within
# scales it: of the largest gradient, at most the step's grad norm; the stored weights one ulp (2 U |w|) apart.
STEP = tiny_hf(14, 7).step_bound()
@pytest.mark.parametrize("optimizer,kwargs", [("SGD", {"lr": 0.1}), ("AdamW", {"lr": 0.01, "eps": 1e-2})])
def test_full_model_accumulation_equals_big_batch(optimizer: str, kwargs: dict) -> None:
    micro = _micro_batches()
    accumulated, single = make_model(seed=7), make_model(seed=7)
    norms = _train(accumulated, micro, accumulation=3, optimizer=optimizer, **kwargs)
    big_norm = _train(single, [concat_batches(micro)], accumulation=1, optimizer=optimizer, **kwargs)[0]
    assert norms[:2] == [None, None]
    assert norms[2] == pytest.approx(big_norm, rel=STEP)
    a, b, initial = _weights(accumulated), _weights(single), _weights(make_model(seed=7))
    slope = kwargs["lr"] / kwargs.get("eps", 1.0)
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=2 * U, atol=slope * STEP * (1 + 128**0.5) * big_norm, msg=key)
    assert sum(not torch.equal(a[k], initial[k]) for k in a) > len(a) // 2
    assert accumulated.optimizer_group["default"].cur_step == single.optimizer_group["default"].cur_step == 1


def test_lora_accumulation_equals_big_batch() -> None:
    micro = _micro_batches()
    models = []
    for _ in range(2):
        model = make_model(seed=8)
        torch.manual_seed(9)
        model.add_adapter_to_model("sft", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                     init_lora_weights=False))
        models.append(model)
    accumulated, single = models
    norm = _train(accumulated, micro, accumulation=3, lr=0.5)[2]
    _train(single, [concat_batches(micro)], accumulation=1, lr=0.5)
    a, b = _weights(accumulated, "sft"), _weights(single, "sft")
    for key in a:  # SGD at lr 0.5: as above
        torch.testing.assert_close(a[key], b[key], rtol=2 * U, atol=0.5 * STEP * (1 + 128**0.5) * norm, msg=key)


def test_reported_loss_is_the_micro_batch_token_mean() -> None:
    model = make_model(seed=1)
    batch = make_batch(3)
    model.set_optimizer("SGD", lr=0.0)
    reported = model.forward_backward(inputs=batch, gradient_accumulation_steps=2)
    with torch.no_grad():
        ref = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          labels=batch["labels"]).loss
    assert reported == pytest.approx(float(ref), rel=tiny_hf(12, 4).forward_bound())  # HF's loss: another order


def test_accumulation_given_to_the_step_call() -> None:
    """seed 000: clip_grad_and_step(gradient_accumulation_steps=N) makes N micro-batches one step."""
    model = make_model(seed=2)
    model.set_optimizer("SGD", lr=0.1)
    group = model.optimizer_group["default"]
    steps = []
    for i in range(8):
        model.forward_backward(inputs=make_batch(i))
        model.clip_grad_and_step(gradient_accumulation_steps=4)
        steps.append(group.cur_step)
    assert steps == [0, 0, 0, 1, 1, 1, 1, 2]
    assert group.gradient_accumulation_steps == 4
