"""RL conventions made explicit (TRL's variants as options) and hostile RL inputs refused with clear messages.

TRL 1.16's own code is the reference where it can be called on its own: the IPO branch of
``DPOTrainer._compute_loss`` and ORPO's ``concatenated_forward`` + ``odds_ratio_loss``, given a
"model" whose logits depend on the token only (a float64 table), so both sides score the same numbers.
"""

from __future__ import annotations

import math
import os
import types
from collections import defaultdict

import pytest
import torch
from rl_testing import make_pairs
from rounding import U, chain_bound

from twinkle.advantage import grpo, rloo
from twinkle.loss import IPOLoss, ORPOLoss
from twinkle.loss.token_inputs import reference_logprobs
from twinkle.processor import InputProcessor
from twinkle.reward import score
from twinkle.rollout import Rollout, rollouts_from_samples
from twinkle.sampler import SampledSequence, SampleResult, SamplingParams

VOCAB = 128


def _table(seed: int) -> torch.Tensor:
    return torch.randn(VOCAB, VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2


def _twinkle_loss(loss, rows: list[dict], packed: bool, policy: torch.Tensor, reference: torch.Tensor | None):
    batch = InputProcessor(pad_token_id=0, padding_free=packed)(rows)
    if reference is not None:
        batch["ref_logprobs"] = reference_logprobs(batch, reference[batch["input_ids"]])
    total, pairs = loss.compute(batch, {"logits": policy[batch["input_ids"]]})
    return float(total / pairs)


def _split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    return rows[0::2], rows[1::2]


def _padded(rows: list[dict], key: str, fill: int) -> torch.Tensor:
    width = max(len(r["input_ids"]) for r in rows)
    return torch.tensor([r[key] + [fill] * (width - len(r[key])) for r in rows])


# ------------------------------------------------------------------ ipo: TRL's length-normalised form
def _trl_ipo(rows: list[dict], beta: float, policy: torch.Tensor, reference: torch.Tensor) -> float:
    trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")
    chosen, rejected = _split(rows)
    ordered = chosen + rejected  # TRL's batch: every chosen row, then every rejected row
    ids = _padded(ordered, "input_ids", 0)
    labels = _padded(ordered, "labels", -100)
    completion_mask = (labels != -100).long()

    def token_logps(table: torch.Tensor) -> torch.Tensor:  # log p(token t+1) where it is a completion token, else 0
        logps = torch.log_softmax(table[ids[:, :-1]], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        return logps * completion_mask[:, 1:]

    ref_sums = token_logps(reference).sum(1)
    outputs = types.SimpleNamespace(log_probs=token_logps(policy), entropy=torch.zeros(ids.shape),
                                    mean_logits=torch.zeros(ids.shape), is_top1=torch.zeros(ids.shape, dtype=bool))
    accelerator = types.SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x, gather=lambda x: x)
    fake = types.SimpleNamespace(
        model=types.SimpleNamespace(training=True), accelerator=accelerator, aux_loss_enabled=False, ld_alpha=None,
        precompute_ref_logps=True, f_divergence_type="reverse_kl", loss_types=["ipo"], loss_weights=[1.0],
        beta=beta, use_weighting=False, label_smoothing=0.0, _metrics={"train": defaultdict(list)},
        _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": ids, "attention_mask": (ids != 0).long() | completion_mask,
              "completion_mask": completion_mask, "ref_chosen_logps": ref_sums[:len(chosen)],
              "ref_rejected_logps": ref_sums[len(chosen):]}
    loss = trl_dpo.DPOTrainer._compute_loss(fake, lambda **_: outputs, inputs, return_outputs=False)
    return float(loss)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_ipo_length_normalized_is_trls_ipo(packed):
    rows = make_pairs(seed=3, count=3)
    policy, reference = _table(1), _table(2)
    expected = _trl_ipo(rows, 0.1, policy, reference)
    got = _twinkle_loss(IPOLoss(beta=0.1, length_normalized=True), rows, packed, policy, reference)
    # float64 on both sides: sums of < 100 log-probabilities, LAMBDA_2 * 2**-53 * sqrt(100) = 1.3e-14 of their
    # magnitude; 1e-10 allows the squared margin (h - 1 / (2 beta))**2 a condition factor of up to 1e4
    assert got == pytest.approx(expected, rel=1e-10)
    summed = _twinkle_loss(IPOLoss(beta=0.1), rows, packed, policy, reference)
    assert summed != pytest.approx(expected, rel=1e-3)  # the default (the paper's sums) is a different convention


# ------------------------------------------------------------------ orpo: TRL's token-mean NLL
def _trl_orpo(rows: list[dict], beta: float, policy: torch.Tensor) -> float:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    orpo = pytest.importorskip("trl.experimental.orpo.orpo_trainer")
    trainer = orpo.ORPOTrainer
    chosen, rejected = _split(rows)
    batch = {}
    for name, part in (("chosen", chosen), ("rejected", rejected)):
        batch[f"{name}_input_ids"] = _padded(part, "input_ids", 0)
        batch[f"{name}_labels"] = _padded(part, "labels", -100)
        batch[f"{name}_attention_mask"] = _padded([{**r, "mask": [1] * len(r["input_ids"])} for r in part], "mask", 0)
    fake = types.SimpleNamespace(is_encoder_decoder=False, padding_value=0, aux_loss_enabled=False, beta=beta,
                                 accelerator=types.SimpleNamespace(device=torch.device("cpu")),
                                 concatenated_inputs=trainer.concatenated_inputs,
                                 get_batch_logps=trainer.get_batch_logps)
    fake.odds_ratio_loss = types.MethodType(trainer.odds_ratio_loss, fake)
    model = lambda ids, **_: types.SimpleNamespace(logits=policy[ids])  # noqa: E731
    chosen_logps, rejected_logps, _, _, nll = trainer.concatenated_forward(fake, model, batch)
    losses = fake.odds_ratio_loss(chosen_logps, rejected_logps)[0]
    return float(nll - losses.mean())  # ORPOTrainer.get_batch_loss_metrics: loss = policy_nll_loss - losses.mean()


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_orpo_token_mean_nll_is_trls_orpo(packed):
    rows = make_pairs(seed=4, count=3)
    policy = _table(5) * 0.3  # moderate log-probabilities: the odds stay well inside float64
    expected = _trl_orpo(rows, 0.1, policy)
    got = _twinkle_loss(ORPOLoss(beta=0.1, nll="token_mean"), rows, packed, policy, None)
    # measured, kept: TRL's odds_ratio_loss casts the log-probabilities to float32 (u = 6e-8 each), then
    # log1p(-exp) and a mean; the loss's condition on them is not at hand, 1e-7 is what passes with room
    assert got == pytest.approx(expected, rel=1e-7)
    answer_mean = _twinkle_loss(ORPOLoss(beta=0.1), rows, packed, policy, None)
    assert answer_mean != pytest.approx(expected, rel=1e-3)


def test_preference_options_are_checked():
    with pytest.raises(ValueError, match="nll='tokens' is not one of answer_mean, token_mean"):
        ORPOLoss(nll="tokens")
    with pytest.raises(TypeError, match="length_normalized must be True or False"):
        IPOLoss(length_normalized="yes")


# ------------------------------------------------------------------ grpo: batch-level reward scaling, no group of one
def test_grpo_batch_scaling_is_trls_scale_rewards_batch():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.2, 0.9, 3.0, 1.0, 2.0, 0.0], dtype=torch.float64)
    # TRL GRPOTrainer, scale_rewards="batch": (r - group mean) / (std of every reward + 1e-4), std unbiased
    group_mean = rewards.view(-1, 4).mean(1).repeat_interleave(4)
    expected = (rewards - group_mean) / (rewards.std() + 1e-4)
    # float32 against float64: a mean and std of <= 12 terms (chain_bound), the rewards' rounding, the difference
    # and quotient (4 u); r - mean cancels, so the absolute room is relative to |r| + |mean|
    rel = chain_bound(12) + 4 * U
    scale = float(rewards.abs().max() + group_mean.abs().max())
    torch.testing.assert_close(grpo(rewards, 4, scale="batch").double(), expected, rtol=rel,
                               atol=rel * scale / float(rewards.std() + 1e-4))
    stds = rewards.view(-1, 4).std(1)
    per_group = (rewards - group_mean) / (stds.repeat_interleave(4) + 1e-4)
    torch.testing.assert_close(grpo(rewards, 4, scale="group").double(), per_group, rtol=rel,
                               atol=rel * scale / float(stds.min() + 1e-4))
    # float32 against float64: assert_close's float64 default rtol 1e-7 is below u; the same room, undivided
    torch.testing.assert_close(grpo(rewards, 4, scale="none").double(), rewards - group_mean, rtol=rel,
                               atol=rel * scale)
    assert torch.equal(grpo(rewards, 4, scale=True), grpo(rewards, 4, scale="group"))
    assert torch.equal(grpo(rewards, 4, scale=False), grpo(rewards, 4, scale="none"))
    with pytest.raises(ValueError, match="scale='global' is not one of group, batch, none"):
        grpo(rewards, 4, scale="global")


@pytest.mark.parametrize("estimator", [grpo, rloo])
def test_a_group_of_one_is_refused_by_grpo_like_rloo(estimator):
    with pytest.raises(ValueError, match="group_size must be an integer >= 2 .a group of one sample has no baseline"):
        estimator([1.0, 0.0, 0.5], 1)


# ------------------------------------------------------------------ rollouts refuse NaN/inf, naming the row
@pytest.mark.parametrize("field,value", [("advantages", float("nan")), ("advantages", [0.5, float("inf")]),
                                         ("logprobs", [-0.1, float("nan")])])
def test_rollout_refuses_non_finite_values(field, value):
    kwargs = {"logprobs": [-0.1, -0.2], "advantages": 1.0, field: value}
    with pytest.raises(ValueError, match=rf"Rollout\.{field}\[\d\] \(completion token \d\) is (nan|inf)"):
        Rollout([1, 2], [3, 4], **kwargs)


def test_rollouts_from_samples_name_the_sample_with_a_non_finite_value():
    results = [SampleResult([1], [SampledSequence([2], [-0.1], "stop"), SampledSequence([3], [-0.2], "stop")]),
               SampleResult([4], [SampledSequence([5], [-0.3], "stop"), SampledSequence([6], [math.nan], "stop")])]
    with pytest.raises(ValueError, match=r"sample 3 \(prompt 1, sequence 1\): Rollout\.logprobs\[0\]"):
        rollouts_from_samples(results, [0.1, 0.2, 0.3, 0.4])
    with pytest.raises(ValueError, match=r"sample 1 \(prompt 0, sequence 1\): Rollout\.advantages\[0\]"):
        rollouts_from_samples(results[:1], [0.1, math.inf])


# ------------------------------------------------------------------ rewards that raise
def test_a_raising_reward_is_named_with_the_completions_index():
    def picky(completion: str, **row) -> float:
        if "boom" in completion:
            raise KeyError("no such key")
        return 1.0

    with pytest.raises(Exception, match=r"Reward '.*picky' raised on completion 2 \('a boom'\): KeyError") as info:
        score([picky, "exact_match"], ["x", "y", "a boom"], [{"answer": "x"}] * 3)
    assert type(info.value).__name__ == "RewardError"  # twinkle.reward.RewardError
    assert info.value.index == 2 and info.value.reward.endswith("picky")
    assert isinstance(info.value.__cause__, KeyError)
    with pytest.raises(Exception, match="Reward 'numeric_match' raised on completion 0 .*holds no number"):
        score(["numeric_match"], ["7"], [{"answer": "seven"}])


def test_a_reward_returning_inf_is_refused():
    with pytest.raises(TypeError, match="returned inf for completion 1"):
        score([lambda completion, **row: math.inf if completion == "b" else 0.0], ["a", "b"])


# ------------------------------------------------------------------ samplers refuse prompts the model cannot take
@pytest.fixture(scope="module")
def sampler():
    from hf_testing import make_model

    from twinkle_hf.sampler import TorchSampler

    return TorchSampler(make_model(seed=0))


def test_sampler_refuses_token_ids_outside_the_vocabulary(sampler):
    vocab = sampler.model.backend.vocab_size
    with pytest.raises(ValueError, match=rf"prompts\[1\] holds token id {vocab + 5} at position 2, outside the model's "
                                         rf"vocabulary \(ids 0..{vocab - 1}\)"):
        sampler.sample([[5, 6], [7, 8, vocab + 5]], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match=r"sequences\[0\] holds token id"):
        sampler.compute_logprobs([[5, vocab]])


def test_sampler_refuses_prompts_beyond_the_models_positions(sampler):
    positions = sampler.model.backend.hf_model().config.max_position_embeddings
    long = [5] * (positions - 2)
    with pytest.raises(ValueError, match=rf"prompts\[0\] needs {positions + 2} positions \({positions - 2} tokens \+ "
                                         rf"max_tokens 4\) but the model has {positions} \(max_position_embeddings\)"):
        sampler.sample([long], SamplingParams(max_tokens=4))
    with pytest.raises(ValueError, match=r"sequences\[0\] needs"):
        sampler.compute_logprobs([[5] * (positions + 1)])
