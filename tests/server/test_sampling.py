"""Sampling through the client: logprobs agree with scoring, snapshots stay fixed, RL losses follow the formula."""

from __future__ import annotations

import numpy as np
import pytest
from server_proc import BASE_MODEL
from server_testing import sft_datums
from tinker import types

ADAM = types.AdamParams(learning_rate=5e-2)


def _datum(tokens: list[int], sampling_logprobs: list[float], advantages: list[float]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": sampling_logprobs,
                                       "advantages": advantages})


@pytest.fixture
def trained(alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=17).result()
    tokenizer = training.get_tokenizer()
    datums = sft_datums(tokenizer)
    for _ in range(2):
        training.forward_backward(datums, "cross_entropy")
        training.optim_step(ADAM).result()
    return training, tokenizer.encode("I am")


def test_samples_carry_the_logprobs_that_scoring_the_same_sequence_gives(server, alice, trained):
    training, prompt = trained
    sampler = training.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=5, stop=[])
    result = sampler.sample(types.ModelInput.from_ints(prompt), 2, params, include_prompt_logprobs=True).result()
    assert len(result.sequences) == 2 and all(len(s.tokens) == 8 for s in result.sequences)
    assert all(s.stop_reason == "length" for s in result.sequences) and result.prompt_logprobs[0] is None
    for seq in result.sequences:
        full = prompt + seq.tokens
        scored = sampler.compute_logprobs(types.ModelInput.from_ints(full)).result()
        np.testing.assert_allclose(seq.logprobs, scored[len(prompt):], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(result.prompt_logprobs[1:], scored[1:len(prompt)], rtol=1e-5, atol=1e-5)
        # an independent path: the training forward's per-token logprobs of the same tokens
        forward = training.forward([types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                                loss_fn_inputs={"target_tokens": full[1:]})], "cross_entropy")
        np.testing.assert_allclose(forward.result().loss_fn_outputs[0]["logprobs"].data[len(prompt) - 1:],
                                   seq.logprobs, rtol=1e-5, atol=1e-5)
    last = sampler.sample(types.ModelInput.from_ints(prompt), 1, params, include_prompt_logprobs=True,
                          prompt_logprobs_last_n=1).result()
    assert last.prompt_logprobs[:-1] == [None] * (len(prompt) - 1) and last.prompt_logprobs[-1] is not None

    # the sampling client keeps the weights it was made with, while training goes on
    training.forward_backward(sft_datums(training.get_tokenizer()), "cross_entropy")
    training.optim_step(ADAM).result()
    again = sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in result.sequences]
    np.testing.assert_allclose(again.sequences[0].logprobs, result.sequences[0].logprobs, rtol=1e-5, atol=1e-6)
    newer = training.save_weights_and_get_sampling_client().result()
    scored_new = newer.compute_logprobs(types.ModelInput.from_ints(prompt + result.sequences[0].tokens)).result()
    assert not np.allclose(scored_new[len(prompt):], result.sequences[0].logprobs, atol=1e-4)

    # a named sampler checkpoint and the base model sample too
    path = training.save_weights_for_sampler("for-sampling").result().path
    named = alice.create_sampling_client(model_path=path).result()
    scored_named = named.compute_logprobs(types.ModelInput.from_ints(prompt + result.sequences[0].tokens)).result()
    np.testing.assert_allclose(scored_named[1:], scored_new[1:], rtol=1e-5, atol=1e-5)
    base = alice.create_sampling_client(base_model=BASE_MODEL).result()
    base_sample = base.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences[0]
    base_scored = base.compute_logprobs(types.ModelInput.from_ints(prompt + base_sample.tokens)).result()
    np.testing.assert_allclose(base_sample.logprobs, base_scored[len(prompt):], rtol=1e-5, atol=1e-5)


def test_rl_steps_with_importance_sampling_and_ppo_follow_the_formulas(server, alice, trained):
    training, prompt = trained
    sampler = training.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=9, stop=[])
    samples = sampler.sample(types.ModelInput.from_ints(prompt), 4, params).result().sequences
    advantages = [1.0, -1.0, 0.5, -0.5]
    rng = np.random.default_rng(0)
    datums, sampling = [], []
    for seq, advantage in zip(samples, advantages):
        # shift the sampler's logprobs so that ratios leave PPO's clip range on some tokens
        q = (np.asarray(seq.logprobs) + rng.normal(0, 0.5, len(seq.tokens))).tolist()
        pad = len(prompt) - 1
        datums.append(_datum(prompt + seq.tokens, [0.0] * pad + q, [0.0] * pad + [advantage] * len(seq.tokens)))
        sampling.append((pad, np.asarray(q), advantage))

    def per_token(result):
        for output, (pad, q, advantage) in zip(result.loss_fn_outputs, sampling):
            p = np.asarray(output["logprobs"].data, dtype=np.float64)[pad:]
            yield np.exp(p - q), advantage

    result = training.forward_backward(datums, "importance_sampling").result()
    expected = sum(float(-(ratio * advantage).sum()) for ratio, advantage in per_token(result))
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
    training.optim_step(ADAM).result()

    config = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    result = training.forward_backward(datums, "ppo", config).result()
    clipped, expected = 0, 0.0
    for ratio, advantage in per_token(result):
        bounded = np.clip(ratio, 0.9, 1.1)
        clipped += int((bounded != ratio).sum())
        expected += float(-np.minimum(ratio * advantage, bounded * advantage).sum())
    assert clipped > 0
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
    training.optim_step(ADAM).result()

    # cispo: the clipped ratio, without gradient, weighs the log-probability; dro: a quadratic penalty
    result = training.forward_backward(datums, "cispo", config).result()
    expected = 0.0
    for output, (pad, q, advantage) in zip(result.loss_fn_outputs, sampling):
        p = np.asarray(output["logprobs"].data, dtype=np.float64)[pad:]
        expected += float(-(np.clip(np.exp(p - q), 0.9, 1.1) * p * advantage).sum())
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
    result = training.forward_backward(datums, "dro", {"beta": 0.1}).result()
    expected = 0.0
    for output, datum in zip(result.loss_fn_outputs, datums):  # every position: prompt ones have q = A = 0
        p = np.asarray(output["logprobs"].data, dtype=np.float64)
        q, advantage = (datum.loss_fn_inputs[k].to_numpy().astype(np.float64) for k in ("logprobs", "advantages"))
        expected += float(-(p * advantage - 0.05 * (p - q) ** 2).sum())
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-5)
    result = training.forward_backward(datums, "gspo").result()  # averaged over sequences
    assert np.isfinite(result.metrics["loss:mean"]) and len(result.loss_fn_outputs) == len(datums)
    training.optim_step(ADAM).result()
