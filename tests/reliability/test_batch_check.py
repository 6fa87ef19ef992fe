"""Issue 13 item 6 (and the token-id weak case): a mismatched or out-of-range batch is refused before any forward."""

from __future__ import annotations

import math

import pytest
import torch
from hf_testing import VOCAB, make_batch, model_state_hash


@pytest.fixture(scope="module")
def model():
    from hostile_testing import lora_model

    return lora_model()


def _with(**changes):
    batch = make_batch(3)
    batch.update(changes)
    return batch


CASES = {
    "mask_short": (lambda: _with(attention_mask=torch.ones(4, 5, dtype=torch.long)),
                   r"attention_mask has shape \(4, 5\) but input_ids has \(4, 12\)"),
    "labels_rows": (lambda: _with(labels=torch.full((3, 12), -100)), r"labels has shape \(3, 12\) but input_ids"),
    "labels_long": (lambda: _with(labels=torch.full((4, 13), -100)), r"labels has shape \(4, 13\)"),
    "position_ids": (lambda: _with(position_ids=torch.arange(11).expand(4, 11)), r"position_ids has shape \(4, 11\)"),
    "id_too_big": (lambda: _with(input_ids=torch.full((4, 12), VOCAB)), rf"token id {VOCAB}, outside .*\[0, {VOCAB}\)"),
    "id_negative": (lambda: _with(input_ids=torch.full((4, 12), -3)), r"token id -3, outside"),
    "label_too_big": (lambda: _with(labels=torch.full((4, 12), VOCAB + 7)), rf"labels holds {VOCAB + 7}"),
    "empty_rows": (lambda: {"input_ids": torch.zeros(0, 12, dtype=torch.long)}, r"batch is empty.*\(0, 12\)"),
    "empty_tokens": (lambda: {"input_ids": torch.zeros(2, 0, dtype=torch.long)}, r"batch is empty"),
    "empty_dict": (lambda: {}, r"no 'input_ids'"),
    "float_ids": (lambda: {"input_ids": torch.rand(2, 4)}, r"integer tensor of shape"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_batch_is_refused_before_the_forward(model, case) -> None:
    make, match = CASES[case]
    group = model.optimizer_group["sft"]
    before, micro = model_state_hash(model), group.micro_step
    with pytest.raises(ValueError, match=match):
        model.forward_backward(inputs=make())
    assert model_state_hash(model) == before and group.micro_step == micro and group.last_outputs is None


def test_a_good_batch_with_ignored_labels_still_trains(model) -> None:
    loss = model.forward_backward(inputs=make_batch(5))
    model.clip_grad_and_step()
    assert math.isfinite(loss)  # a LazyFloat: read as a number


def test_multi_tenant_batched_step_checks_every_tenant(tmp_path) -> None:
    from hf_testing import tiny_config
    from peft import LoraConfig

    from twinkle.model import MultiLoraTransformersModel

    torch.manual_seed(0)
    model = MultiLoraTransformersModel(config=tiny_config(), mixed_precision="no", max_loras=2, max_r=4,
                                       target_modules=["q_proj", "v_proj"])
    for tenant in ("a", "b"):
        model.multi_lora.acquire_lora(tenant, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    bad = _with(input_ids=torch.full((4, 12), VOCAB + 1))
    with pytest.raises(ValueError, match=rf"token id {VOCAB + 1}"):
        model.forward_backward_multi({"a": make_batch(1), "b": bad})
    assert model._group("a").micro_step == 0 and model._group("b").micro_step == 0
