"""Sampling through the client: logprobs agree with scoring, snapshots stay fixed, RL losses follow the formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rounding import U, chain_bound, tiny_qwen, within
from server_proc import BASE_MODEL
from server_testing import sft_datums
from tinker import types

ADAM = types.AdamParams(learning_rate=5e-2)
#: sampling (a KV cache, one new token a pass), scoring and the training forward compute the same <= 16-token
#: sequences' logprobs in other summation orders: a forward's bound (tests/rounding.py), elementwise by within()
FORWARD = tiny_qwen(seq=16, rows=2).forward_bound()


def _close(got, want) -> None:
    want = np.asarray(want, dtype=np.float64)
    np.testing.assert_allclose(got, want, **within(FORWARD, torch.as_tensor(want)))


def _loss_room(terms: list, logs: list) -> float:
    """The server's float32 loss against the float64 formula on the logprobs it returned: each term rounds its
    inputs to float32 (its exponent ``p - q`` by ``u (|p| + |q|)``) and its exp, product and difference (``3 u``),
    then the sum of ``n`` terms (chain_bound). The terms' signs follow the advantages, so the room is absolute:
    relative to ``sum |term|``."""
    n, scale = sum(t.size for t in terms), sum(float(np.abs(t).sum()) for t in terms)
    return scale * (chain_bound(n) + U * (max(float(np.abs(x).max()) for x in logs) * 2 + 3))


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
        _close(seq.logprobs, scored[len(prompt):])
        _close(result.prompt_logprobs[1:], scored[1:len(prompt)])
        # an independent path: the training forward's per-token logprobs of the same tokens
        forward = training.forward([types.Datum(model_input=types.ModelInput.from_ints(full[:-1]),
                                                loss_fn_inputs={"target_tokens": full[1:]})], "cross_entropy")
        _close(forward.result().loss_fn_outputs[0]["logprobs"].data[len(prompt) - 1:], seq.logprobs)
    last = sampler.sample(types.ModelInput.from_ints(prompt), 1, params, include_prompt_logprobs=True,
                          prompt_logprobs_last_n=1).result()
    assert last.prompt_logprobs[:-1] == [None] * (len(prompt) - 1) and last.prompt_logprobs[-1] is not None

    # the sampling client keeps the weights it was made with, while training goes on
    training.forward_backward(sft_datums(training.get_tokenizer()), "cross_entropy")
    training.optim_step(ADAM).result()
    again = sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result()
    assert [s.tokens for s in again.sequences] == [s.tokens for s in result.sequences]
    # exact: the same weights, inputs and operations in the same process
    assert again.sequences[0].logprobs == result.sequences[0].logprobs
    newer = training.save_weights_and_get_sampling_client().result()
    scored_new = newer.compute_logprobs(types.ModelInput.from_ints(prompt + result.sequences[0].tokens)).result()
    old = np.asarray(result.sequences[0].logprobs)
    assert not np.allclose(scored_new[len(prompt):], old, **within(FORWARD, torch.as_tensor(old)))  # beyond the bound

    # a named sampler checkpoint and the base model sample too
    path = training.save_weights_for_sampler("for-sampling").result().path
    named = alice.create_sampling_client(model_path=path).result()
    scored_named = named.compute_logprobs(types.ModelInput.from_ints(prompt + result.sequences[0].tokens)).result()
    # exact: the saved adapter loads bitwise (safetensors) and is scored by the same operations
    assert scored_named[1:] == scored_new[1:]
    base = alice.create_sampling_client(base_model=BASE_MODEL).result()
    base_sample = base.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences[0]
    base_scored = base.compute_logprobs(types.ModelInput.from_ints(prompt + base_sample.tokens)).result()
    _close(base_sample.logprobs, base_scored[len(prompt):])


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

    logs = [q for _, q, _ in sampling]

    def per_token(result):
        for output, (pad, q, advantage) in zip(result.loss_fn_outputs, sampling):
            p = np.asarray(output["logprobs"].data, dtype=np.float64)[pad:]
            logs.append(p)
            yield np.exp(p - q), advantage

    result = training.forward_backward(datums, "importance_sampling").result()
    terms = [-(ratio * advantage) for ratio, advantage in per_token(result)]
    expected = sum(float(t.sum()) for t in terms)
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=0, abs=_loss_room(terms, logs))
    training.optim_step(ADAM).result()

    config = {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    result = training.forward_backward(datums, "ppo", config).result()
    clipped, terms = 0, []
    for ratio, advantage in per_token(result):
        bounded = np.clip(ratio, 0.9, 1.1)
        clipped += int((bounded != ratio).sum())
        terms.append(-np.minimum(ratio * advantage, bounded * advantage))
    assert clipped > 0
    expected = sum(float(t.sum()) for t in terms)
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=0, abs=_loss_room(terms, logs))
    training.optim_step(ADAM).result()

    # cispo: the clipped ratio, without gradient, weighs the log-probability; dro: a quadratic penalty
    result = training.forward_backward(datums, "cispo", config).result()
    terms = []
    for output, (pad, q, advantage) in zip(result.loss_fn_outputs, sampling):
        p = np.asarray(output["logprobs"].data, dtype=np.float64)[pad:]
        logs.append(p)
        terms.append(-(np.clip(np.exp(p - q), 0.9, 1.1) * p * advantage))
    expected = sum(float(t.sum()) for t in terms)
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=0, abs=_loss_room(terms, logs))
    result = training.forward_backward(datums, "dro", {"beta": 0.1}).result()
    terms = []
    for output, datum in zip(result.loss_fn_outputs, datums):  # every position: prompt ones have q = A = 0
        p = np.asarray(output["logprobs"].data, dtype=np.float64)
        q, advantage = (datum.loss_fn_inputs[k].to_numpy().astype(np.float64) for k in ("logprobs", "advantages"))
        logs.append(p)
        # |p - q| (p - q)^2's rounding: 2 |p - q| u relative, within the 2 max|log| u of _loss_room
        terms.append(-(p * advantage - 0.05 * (p - q) ** 2))
    expected = sum(float(t.sum()) for t in terms)
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=0, abs=_loss_room(terms, logs))
    result = training.forward_backward(datums, "gspo").result()  # averaged over sequences
    assert np.isfinite(result.metrics["loss:mean"]) and len(result.loss_fn_outputs) == len(datums)
    training.optim_step(ADAM).result()
