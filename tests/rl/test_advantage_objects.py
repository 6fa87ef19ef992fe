"""Upstream Twinkle's advantage objects, and reward tables with one column per reward function."""

import pytest
import torch
from rounding import U

from twinkle.advantage import GRPOAdvantage, RLOOAdvantage, grpo, rloo


def test_a_reward_table_is_summed_per_sample_not_flattened():
    # 4 samples x 2 reward functions: totals 3, 7, 11, 15 (group mean 9); flattening would give 8 advantages
    table = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    assert grpo(table, 4, scale="none").tolist() == [-6.0, -2.0, 2.0, 6.0]
    # leave-one-out of the totals: 3 - (7 + 11 + 15) / 3 = -8, 15 - (3 + 7 + 11) / 3 = 8
    assert rloo(table, 4).tolist() == [-8.0, pytest.approx(-8 / 3), pytest.approx(8 / 3), 8.0]
    assert GRPOAdvantage()(table.tolist(), num_generations=2, scale="none").tolist() == [-2.0, 2.0, -2.0, 2.0]


def test_a_reward_tensor_of_three_dimensions_is_refused():
    with pytest.raises(ValueError, match=r"shape \(2, 2, 1\) have more than 2 dimensions"):
        grpo(torch.zeros(2, 2, 1), 2)


#: float32 advantages of integer rewards against float64 Python: the means, deviations and sums of squares are
#: exact; the division of the sum, the square root and the final division round (u each, 3 u), and the eps
#: (1e-8) moves a std >= 1 by at most 1e-8 relative
ROOM = 4 * U + 1e-8


def test_grpo_advantage_matches_the_function_with_upstreams_eps():
    rewards = torch.tensor([0.0, 2.0, 1.0, 5.0, 4.0, 4.0, 1.0, 0.0])
    for scale in ("group", "batch", "none"):
        expected = grpo(rewards, 4, scale=scale, eps=1e-8)
        assert torch.equal(GRPOAdvantage()(rewards, num_generations=4, scale=scale), expected)
    # default scale is 'group': group 1 = [0, 2, 1, 5], mean 2, unbiased std sqrt(14/3)
    got = GRPOAdvantage()(rewards, num_generations=4)
    assert got[:4].tolist() == pytest.approx([v / (14 / 3) ** 0.5 for v in (-2.0, 0.0, -1.0, 3.0)], rel=ROOM, abs=0)


def test_grpo_advantage_without_groups():
    rewards = [1.0, 3.0, 5.0]
    assert GRPOAdvantage()(rewards, num_generations=1).tolist() == rewards  # 'group' of one: the rewards
    assert GRPOAdvantage()(rewards, num_generations=1, scale="none").tolist() == [-2.0, 0.0, 2.0]
    # batch std of [1, 3, 5] (unbiased) is 2
    # float32: the mean, deviations and squares of these integers, 8 / 2 and sqrt(4) are exact, and 2 + 1e-8
    # rounds to 2: exact
    assert GRPOAdvantage()(rewards, num_generations=1, scale="batch").tolist() == [-1.0, 0.0, 1.0]


def test_rloo_advantage_scales_by_the_groups_reward_std():
    rewards = torch.tensor([1.0, 3.0, 5.0, 9.0])
    raw = rloo(rewards, 2)
    assert raw.tolist() == [-2.0, 2.0, -4.0, 4.0]
    # group stds (unbiased) of [1, 3] and [5, 9]: sqrt(2) and sqrt(8)
    got = RLOOAdvantage()(rewards, num_generations=2)
    assert got.tolist() == pytest.approx([-2 / 2 ** 0.5, 2 / 2 ** 0.5, -4 / 8 ** 0.5, 4 / 8 ** 0.5], rel=ROOM, abs=0)
    assert torch.equal(RLOOAdvantage()(rewards, num_generations=2, scale="none"), raw)


@pytest.mark.parametrize("call, message", [
    (lambda: RLOOAdvantage()([1.0, 2.0], num_generations=1), "group_size must be an integer >= 2"),
    (lambda: GRPOAdvantage()([1.0, 2.0, 3.0], num_generations=2), "whole groups of 2"),
    (lambda: GRPOAdvantage()([1.0, 2.0], num_generations=0), "group_size must be an integer >= 2"),
    (lambda: GRPOAdvantage()([1.0, 2.0], num_generations=2, scale="std"), "scale='std' is not one of"),
    (lambda: GRPOAdvantage()([1.0, float("inf")], num_generations=1), "inf"),
])
def test_advantage_objects_refuse_bad_arguments_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()
