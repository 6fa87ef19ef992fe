"""Seed 001's loss signature: ``set_loss(fn)``, ``fn(inputs: InputFeature, outputs: ModelOutput, ...) -> Tensor``."""

from __future__ import annotations

import inspect
import typing

import pytest
import torch
import torch.nn.functional as F
from hf_testing import make_batch, make_model
from rounding import U, tiny_hf

import twinkle
from twinkle.loss import CrossEntropyLoss, Loss
from twinkle.model import TwinkleModel
from twinkle.types import InputFeature, ModelOutput


def token_mean_ce(inputs: InputFeature, outputs: ModelOutput, scale: float = 1.0) -> torch.Tensor:
    """A user's loss, written against the public types only: next-token cross-entropy over the trained tokens."""
    logits = outputs["logits"][:, :-1].float()
    labels = inputs["labels"][:, 1:]
    return scale * F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)


def test_the_types_are_public_and_name_the_loss_arguments():
    assert twinkle.InputFeature is InputFeature and twinkle.ModelOutput is ModelOutput
    hints = typing.get_type_hints(Loss.compute)
    assert hints["inputs"] is InputFeature and hints["outputs"] is ModelOutput
    assert "Callable[[InputFeature, ModelOutput], Tensor]" in str(inspect.signature(TwinkleModel.set_loss))
    assert {"input_ids", "labels", "target_tokens", "advantages", "pixel_values"} <= set(InputFeature.__annotations__)
    assert {"logits", "embeddings", "last_hidden_state"} <= set(ModelOutput.__annotations__)
    batch = InputFeature(input_ids=torch.tensor([[1, 2]]), labels=torch.tensor([[-100, 2]]))
    assert isinstance(batch, dict)  # a TypedDict is a plain dict at run time: a batch forward_backward takes


def test_a_function_of_input_feature_and_model_output_trains_like_the_builtin_loss():
    batches = [InputFeature(**make_batch(seed=s)) for s in (1, 2, 3)]
    mine, builtin = make_model(seed=0), make_model(seed=0)
    mine.set_loss(token_mean_ce)
    builtin.set_loss(CrossEntropyLoss())
    for model in (mine, builtin):  # eps = 1: Lipschitz in the gradient (the two losses round differently)
        model.set_optimizer("AdamW", lr=1e-2, eps=1.0)
    # the two losses sum in other orders: a forward's and a step's float32 bound, 4 rows of 12 tokens, and step k
    # carries the earlier steps' rounding twice (tests/rounding.py); a weight moves by at most 2 lr per unit of
    # gradient per step, the gradient's difference of the largest gradient (at most the clipped norm 1)
    fwd, bound = tiny_hf(12, 4).forward_bound(), (2 * 2 + 1) * tiny_hf(12, 4).step_bound()
    for batch in batches:  # one micro-batch per step: the batch mean is the token mean, so the steps are the same
        got, expected = mine.forward_backward(inputs=batch), builtin.forward_backward(inputs=batch)
        assert float(got) == pytest.approx(float(expected), rel=bound)
        mine.clip_grad_and_step()
        builtin.clip_grad_and_step()
    for (name, a), (_, b) in zip(mine.model.named_parameters(), builtin.model.named_parameters()):
        # each of the 3 steps stores its weight rounded: one ulp (2 U |w|) apart at most per step
        torch.testing.assert_close(a, b, rtol=3 * 2 * U, atol=3 * 2 * 1e-2 * bound * (1 + 128**0.5), msg=name)
    for model in (mine, builtin):
        model.forward(inputs=batches[0])
    assert float(mine.calculate_loss(scale=2.0)) == pytest.approx(2 * float(builtin.calculate_loss()), rel=bound + fwd)
