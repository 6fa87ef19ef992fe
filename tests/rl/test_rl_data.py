"""Advantages, rewards, rollout rows through the InputProcessor, and the Template's prompt and preference encodings."""

from __future__ import annotations

import statistics
from fractions import Fraction

import pytest
import torch
from rounding import U, chain_bound

from twinkle.advantage import grpo, reward_minus_baseline, rloo
from twinkle.processor import InputProcessor
from twinkle.registry import get_registry, resolve
from twinkle.reward import exact_match, format_match, numeric_match, register_reward, score
from twinkle.reward.builtin import parse_number
from twinkle.rollout import Rollout, rollouts_from_samples
from twinkle.sampler import SampledSequence, SampleResult


# ------------------------------------------------------------------ advantages
def test_grpo_advantages_are_group_normalised():
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.2, 0.9]
    got = grpo(rewards, group_size=4)
    for g in range(2):
        group = rewards[4 * g:4 * g + 4]
        mean, std = statistics.mean(group), statistics.stdev(group)
        # float32: a mean and std of 4 terms (chain_bound), the rewards' rounding, the difference and quotient (4 u);
        # r - mean cancels (0.5 - 0.525), so the room is relative to |r| + |mean|
        rel = chain_bound(4) + 4 * U
        for k, r in enumerate(group):
            want = (r - mean) / (std + 1e-4)
            assert float(got[4 * g + k]) == pytest.approx(want, rel=rel, abs=rel * (abs(r) + mean) / (std + 1e-4))
    assert grpo([2.0, 2.0, 2.0], 3).abs().sum() == 0  # no signal in a uniform group
    centred = grpo(rewards, 4, scale=False)
    assert float(centred[0]) == 1.0 - statistics.mean(rewards[:4])  # exact: 1 - 0.5 in binary


def test_rloo_is_reward_minus_the_others_mean():
    rewards = [3.0, 1.0, 2.0, 0.0, 5.0, 1.0]
    got = rloo(rewards, group_size=3)
    for i, r in enumerate(rewards):
        group = rewards[3 * (i // 3):3 * (i // 3) + 3]
        others = [x for j, x in enumerate(group) if j != i % 3]
        assert float(got[i]) == r - sum(others) / len(others)  # exact: integers and halves in binary


def test_reward_minus_baseline():
    assert reward_minus_baseline([1.0, 3.0], baseline=1.0).tolist() == [0.0, 2.0]
    assert reward_minus_baseline([1.0, 3.0]).tolist() == [-1.0, 1.0]


@pytest.mark.parametrize("call,message", [
    (lambda: grpo([1.0, 2.0, 3.0], 2), "whole groups of 2"),
    (lambda: rloo([1.0, 2.0], 1), "group_size must be an integer >= 2"),
    (lambda: grpo([1.0, float("nan")], 2), "NaN"),
])
def test_advantage_errors_say_what_is_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_advantages_are_registered():
    assert resolve("advantage", "grpo") is grpo and resolve("advantage", "rloo") is rloo
    assert resolve("advantage", "reward_minus_baseline") is reward_minus_baseline


# ------------------------------------------------------------------ rewards
@pytest.mark.parametrize("completion,answer,expected", [
    ("The answer is 42.", "42", 1.0), ("so \\boxed{3/4} done", "0.75", 1.0), ("total: 1,234", "1234", 1.0),
    ("I think 41", "42", 0.0), ("no number here", "7", 0.0), ("-2.50", "-2.5", 1.0), ("7 then 8", "7", 0.0),
])
def test_numeric_match(completion, answer, expected):
    assert numeric_match(completion, answer) == expected


def test_parse_number_reads_the_final_number_exactly():
    assert parse_number("a 1/3 b") == Fraction(1, 3) and parse_number("x") is None


def test_exact_and_format_match():
    assert exact_match("  Paris\n", answer="Paris") == 1.0 and exact_match("paris", answer="Paris") == 0.0
    assert format_match("<think>hm\nok</think> <answer>4</answer>") == 1.0
    assert format_match("<answer>4</answer>") == 0.0
    assert format_match("ABC", pattern=r"[A-Z]+") == 1.0
    with pytest.raises(ValueError, match="answer"):
        exact_match("x")


def test_script_rewards_register_list_and_score():
    @register_reward("test_length_reward")
    def length_reward(completion: str, **row) -> float:
        return len(completion) / 10

    registry = get_registry()
    assert resolve("reward", "test_length_reward") is length_reward
    assert any(c.name == "test_length_reward" and c.distribution == "<script>" for c in registry.components("reward"))
    with pytest.raises(Exception, match="already registered"):
        register_reward("exact_match")(length_reward)
    totals = score({"test_length_reward": 1.0, "exact_match": 2.0}, ["abcd", "yes"],
                   [{"answer": "x"}, {"answer": "yes"}])
    assert totals == pytest.approx([0.4, 0.3 + 2.0])  # Python floats: weighted sums of two, a few ulps
    with pytest.raises(TypeError, match="returns a finite number"):
        score([lambda completion, **row: "good"], ["a"])


# ------------------------------------------------------------------ rollouts and the processor
def test_rollout_row_is_in_tinker_alignment():
    r = Rollout([5, 6, 7], [8, 9], [-0.5, -1.5], advantages=2.0)
    assert r["input_ids"] == [5, 6, 7, 8] and r["target_tokens"] == [6, 7, 8, 9]
    assert r["weights"] == [0, 0, 1, 1] and r["logprobs"] == [0, 0, -0.5, -1.5] and r["advantages"] == [0, 0, 2, 2]
    masked = Rollout([5], [8, 9, 10], [0.0, 0.0, 0.0], advantages=[1.0, 2.0, 3.0], mask=[1, 0, 1])
    assert masked["weights"] == [1, 0, 1] and masked["advantages"] == [1, 2, 3]
    with pytest.raises(ValueError, match="2 values for 3 completion tokens"):
        Rollout([1], [2, 3, 4], [0.0, 0.0])


def test_rollouts_from_samples_follow_sampler_order():
    results = [SampleResult([1, 2], [SampledSequence([3], [-1.0], "stop"),
                                     SampledSequence([4, 5], [-1.0, -2.0], "length")]),
               SampleResult([6], [SampledSequence([7], [-0.1], "stop"), SampledSequence([8], [-0.2], "stop")])]
    rollouts = rollouts_from_samples(results, [0.5, -0.5, 1.0, -1.0], rewards=[1, 0, 1, 0])
    assert [r.sequence for r in rollouts] == [[1, 2, 3], [1, 2, 4, 5], [6, 7], [6, 8]]
    assert [r["advantages"][-1] for r in rollouts] == [0.5, -0.5, 1.0, -1.0]
    with pytest.raises(ValueError, match="3 advantages for 4 samples"):
        rollouts_from_samples(results, [0.0] * 3)


def test_processor_pads_and_packs_rollouts_like_sft_rows():
    rollouts = [Rollout([5, 6, 7], [8, 9], [-0.5, -1.5], 2.0), Rollout([4], [3], [-0.25], -1.0)]
    padded = InputProcessor(pad_token_id=0)(rollouts)
    assert padded["input_ids"].tolist() == [[5, 6, 7, 8], [4, 0, 0, 0]]
    assert padded["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 0, 0, 0]]
    assert padded["target_tokens"].dtype == torch.long
    assert padded["target_tokens"].tolist() == [[6, 7, 8, 9], [3, 0, 0, 0]]
    assert padded["logprobs"].dtype == torch.float32
    assert padded["advantages"].tolist() == [[0, 0, 2, 2], [-1, 0, 0, 0]]
    left = InputProcessor(pad_token_id=0, padding_side="left")(rollouts)
    assert left["weights"].tolist() == [[0, 0, 1, 1], [0, 0, 0, 1]]
    packed = InputProcessor(padding_free=True)(rollouts)
    assert packed["input_ids"].tolist() == [[5, 6, 7, 8, 4]] and packed["position_ids"].tolist() == [[0, 1, 2, 3, 0]]
    assert packed["logprobs"].tolist() == [[0, 0, -0.5, -1.5, -0.25]]
    with pytest.raises(Exception, match="different per-token fields"):
        InputProcessor()([rollouts[0], {"input_ids": [1, 2]}])
    with pytest.raises(Exception, match="one per token"):
        InputProcessor()([{"input_ids": [1, 2], "advantages": [1.0]}])


# ------------------------------------------------------------------ template encodings
@pytest.fixture(scope="module")
def template():
    from twinkle.template import Template

    return Template()


def test_encode_prompt_is_the_chat_template_with_the_generation_prompt(template):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say 7"}]
    expected = template.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    encoded = template.encode_prompt({"messages": messages})
    assert template.tokenizer.decode(encoded["input_ids"]) == expected
    assert encoded["length"] == len(encoded["input_ids"])
    with pytest.raises(Exception, match="ending with a user"):
        template.encode_prompt([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])


def test_preference_pair_shares_the_prompt_and_trains_each_answer(template):
    chosen, rejected = template.encode_preference({"prompt": "Pick a color", "chosen": "blue",
                                                   "rejected": [{"role": "assistant", "content": "a dull grey"}]})
    prompt = template.encode_prompt([{"role": "user", "content": "Pick a color"}])["input_ids"]
    for row, answer in ((chosen, "blue"), (rejected, "a dull grey")):
        assert row["input_ids"][:len(prompt)] == prompt
        trained = [t for t in row["labels"] if t != -100]
        assert template.tokenizer.decode(trained).startswith(answer)
        assert all(label == -100 for label in row["labels"][:len(prompt)])
    with pytest.raises(Exception, match="'chosen'"):
        template.encode_preference({"prompt": "x", "rejected": "y"})


def test_twinkle_plugins_lists_samplers_advantages_and_rewards():
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "twinkle.cli.main", "plugins", "--json"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    listing = json.loads(proc.stdout)
    rows = listing["components"] if isinstance(listing, dict) else listing
    found = {(r["kind"], r["name"]): r["distribution"] for r in rows}
    assert found[("sampler", "TorchSampler")] == found[("sampler", "VLLMSampler")] == "twinkle-hf"
    assert found[("advantage", "grpo")] == found[("reward", "numeric_match")] == "twinkle-core"
    for name in ("importance_sampling", "ppo", "cispo", "dro", "gspo", "grpo", "dr_grpo", "bnpo", "dpo", "ipo",
                 "simpo", "orpo", "cross_entropy"):
        assert found[("loss", name)] == "twinkle-core", name
