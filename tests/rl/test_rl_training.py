"""RL and preference losses inside TransformersModel: exact under accumulation, padded or packed, with the
reference computed from the base (adapters off), and each sample's target log-probabilities handed back."""

from __future__ import annotations

import math

import pytest
import torch
from hf_testing import VOCAB, make_model
from peft import LoraConfig
from rl_testing import make_pairs, make_rollouts
from rounding import LORA_TERMS, U, tiny_hf, within

from twinkle.processor import InputProcessor
from twinkle.rollout import Rollout
from twinkle.sampler import SamplingParams
from twinkle_hf.sampler import TorchSampler

#: at most 32 rows of at most 12 tokens (rl_testing) through the tiny model with a LoRA: float32's bounds for
#: another summation order of a forward and of a step (tests/rounding.py)
FWD = tiny_hf(12, 32, extra=LORA_TERMS).forward_bound()
STEP = tiny_hf(12, 32, extra=LORA_TERMS).step_bound()


def _same_update(got, want, start, key):
    """One SGD step: the weights differ by lr times the gradients' difference, within rounding.within's bound of
    the update (rtol on each element, sqrt(128) on the largest), plus u per stored weight (rtol 2u)."""
    update = want - start
    atol = STEP * (1 + 128**0.5) * float(update.abs().max())
    torch.testing.assert_close(got, want, rtol=2 * U, atol=atol, msg=key)


def _lora_model(seed: int = 0):
    model = make_model(seed=seed)
    torch.manual_seed(seed + 1)
    model.add_adapter_to_model("policy", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                                                    init_lora_weights=False))
    return model


def _train(model, batches, loss, accumulation, **options):
    model.set_loss(loss, adapter_name="policy", **options)
    model.set_optimizer("SGD", lr=0.5, adapter_name="policy")
    for batch in batches:
        model.forward_backward(inputs=batch, adapter_name="policy", gradient_accumulation_steps=accumulation)
        model.clip_grad_and_step(max_grad_norm=1e9, adapter_name="policy")
    return {k: v.detach().clone() for k, v in model.get_state_dict(adapter_name="policy").items()}


CASES = [("ppo", {}, make_rollouts), ("grpo", {"beta": 0.2}, make_rollouts), ("bnpo", {}, make_rollouts),
         ("dr_grpo", {"max_tokens": 8}, make_rollouts),
         ("gspo", {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}, make_rollouts),
         ("dpo", {"beta": 0.5}, make_pairs), ("orpo", {}, make_pairs)]


@pytest.mark.parametrize("loss,options,make", CASES, ids=[c[0] for c in CASES])
def test_accumulation_equals_one_big_batch(loss, options, make):
    micro = [make(10), make(11, 1 if make is make_pairs else 2), make(12)]
    accumulated = _train(_lora_model(), micro, loss, accumulation=3, **options)
    single = _train(_lora_model(), [[row for batch in micro for row in batch]], loss, accumulation=1, **options)
    initial = _lora_model().get_state_dict(adapter_name="policy")
    for key in single:
        _same_update(accumulated[key], single[key], initial[key], key)
    assert any(not torch.equal(single[k], initial[k]) for k in single)


@pytest.mark.parametrize("loss,options,make", [CASES[1], CASES[5]], ids=["grpo", "dpo"])
def test_packed_rows_give_the_padded_gradient(loss, options, make):
    padded = _train(_lora_model(), [make(20)], loss, accumulation=1, **options)
    initial = _lora_model().get_state_dict(adapter_name="policy")
    model = _lora_model()
    model.set_processor(InputProcessor(padding_free=True), adapter_name="policy")
    packed = _train(model, [make(20)], loss, accumulation=1, **options)
    for key in padded:
        _same_update(packed[key], padded[key], initial[key], key)


def test_loss_outputs_are_the_samplers_logprobs_and_on_policy_ppo_is_minus_the_advantage_sum():
    model = _lora_model()
    sampler = TorchSampler(model)
    results = sampler.sample([[5, 6, 7], [9, 10]], SamplingParams(max_tokens=5, n=2, seed=0, stop=[]),
                             adapter_name="policy")
    advantages = [1.0, -0.5, 0.25, 2.0]
    rollouts = [Rollout(r.prompt, s.tokens, s.logprobs, a)
                for (r, s), a in zip([(r, s) for r in results for s in r.sequences], advantages)]
    model.set_loss("ppo", adapter_name="policy")
    reported = model.forward_backward(inputs=rollouts, adapter_name="policy")
    # ratio 1 on every token, up to the sampler's incremental forward against the full one: |ratio - 1| within
    # the logprobs' bound below, times the 5 tokens' advantages
    # rounding.within's bound, with |logprob| <= log(2 V) (the untrained tiny model is near uniform: ~log V)
    lp_bound = FWD * (1 + 128**0.5) * math.log(2 * VOCAB)
    weight = sum(abs(a) * 5 for a in advantages)
    assert reported == pytest.approx(-sum(a * 5 for a in advantages), abs=lp_bound * weight)
    outputs = model.get_loss_outputs(adapter_name="policy")
    scored = sampler.compute_logprobs([r.sequence for r in rollouts], adapter_name="policy")
    assert len(outputs) == len(rollouts)
    for rollout, out, values in zip(rollouts, outputs, scored):
        assert out["logprobs"].shape == (len(rollout.sequence) - 1,)
        want = torch.tensor(values[1:])  # another forward (summation order) of the same model
        torch.testing.assert_close(out["logprobs"], want, **within(FWD, want))


def test_model_reference_equals_the_samplers_reference_logprobs():
    rollouts = make_rollouts(30)
    auto = _train(_lora_model(), [rollouts], "grpo", accumulation=1, beta=0.3)
    model = _lora_model()
    ref = TorchSampler(model).compute_logprobs([r.sequence for r in rollouts], adapter_name="policy", reference=True)
    explicit = [{**dict(r), "ref_logprobs": values[1:]} for r, values in zip(rollouts, ref)]
    given = _train(model, [explicit], "grpo", accumulation=1, beta=0.3)
    initial = _lora_model().get_state_dict(adapter_name="policy")
    for key in auto:
        _same_update(auto[key], given[key], initial[key], key)


def test_full_model_reference_needs_a_second_model():
    model = make_model(seed=0)
    model.set_loss("dpo")
    with pytest.raises(ValueError, match="ref_logprobs"):
        model.forward_backward(inputs=make_pairs(1))


def test_evaluation_reports_preference_rewards():
    model = _lora_model()
    model.set_loss("simpo", adapter_name="policy")
    model.forward_only(inputs=make_pairs(3, 3), adapter_name="policy")
    loss = model.calculate_loss(adapter_name="policy")
    outputs = model.get_loss_outputs(adapter_name="policy")
    assert len(outputs) == 6 and all("reward" in o for o in outputs) and loss > 0
    model.set_loss("CrossEntropyLoss", adapter_name="policy")
    model.forward_only(inputs=make_pairs(3), adapter_name="policy")
    model.calculate_loss(adapter_name="policy")
    assert model.get_loss_outputs(adapter_name="policy") == []


def test_unpaired_preference_batch_is_refused_before_the_forward():
    """Three trained sequences cannot pair: refused in collation, before any forward or gradient."""
    model = _lora_model()
    model.set_loss("dpo", adapter_name="policy")
    model.set_optimizer("SGD", lr=0.5, adapter_name="policy")
    before = {k: v.clone() for k, v in model.get_state_dict(adapter_name="policy").items()}
    with pytest.raises(ValueError, match="pairs.*this batch has 3"):
        model.forward_backward(inputs=make_pairs(5)[:3], adapter_name="policy")
    assert all(p.grad is None for p in model.model.parameters())
    model.forward_backward(inputs=make_pairs(5), adapter_name="policy")  # the whole pairs train
    model.clip_grad_and_step(adapter_name="policy")
    after = model.get_state_dict(adapter_name="policy")
    assert any(not torch.equal(after[k], before[k]) for k in before)
