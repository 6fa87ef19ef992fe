"""Upstream Twinkle's reward objects over trajectories: answers found, compared exactly, formats checked."""

from __future__ import annotations

import pytest

from twinkle.reward import FormatReward, GSM8KAccuracyReward, GSM8KFormatReward, MathReward


def _trajectory(reply: str, **user_data) -> dict:
    return {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": reply}],
            "user_data": list(user_data.items())}


def test_gsm8k_accuracy_reads_boxed_or_hash_answers_exactly():
    trajectories = [
        _trajectory("so \\boxed{1,234}", ground_truth="1234"),
        _trajectory("work... #### 72", ground_truth="72.0"),
        _trajectory("#### 71", ground_truth="72"),
        _trajectory("no answer at all", ground_truth="5"),
        _trajectory("\\boxed{\\frac{1}{2}} then #### 3", ground_truth="3"),  # the boxed answer wins over ####
    ]
    assert GSM8KAccuracyReward()(trajectories) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert GSM8KFormatReward()(trajectories) == [1.0, 1.0, 1.0, 0.0, 1.0]
    with pytest.raises(ValueError, match=r"trajectory 0 has no reference answer: .*\('ground_truth', answer\)"):
        GSM8KAccuracyReward()([_trajectory("#### 1")])


def test_math_reward_against_ground_truth_trajectories():
    predictions = [_trajectory("Thus \\boxed{0.5}"), _trajectory("# Answer\n\\boxed{x^2}"), _trajectory("\\boxed{3}")]
    truths = [{"messages": [{"role": "assistant", "content": "\\boxed{1/2}"}]},
              {"messages": [{"role": "assistant", "content": "it is \\boxed{{x^2}}"}]},
              {"messages": [{"role": "assistant", "content": "\\boxed{4}"}]}]
    assert MathReward()(predictions, truths) == [1.0, 1.0, 0.0]
    assert MathReward(ground_truth_key="answer")([_trajectory("\\boxed{7}", answer="7")]) == [1.0]


def test_format_reward_needs_think_and_answer_blocks():
    rows = [_trajectory("<think>a</think> x <answer>b</answer>"), _trajectory("<answer>b</answer>"), _trajectory("")]
    assert FormatReward()(rows, None) == [1.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="trajectories with 'messages'"):
        FormatReward()([{"text": "x"}])
