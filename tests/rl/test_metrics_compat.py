"""Upstream Twinkle's metric names and accumulate/calculate, each against a hand computation."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
import torch.nn.functional as F
from rounding import U, chain_bound

from twinkle.metric import (
    Accuracy,
    CISPOMetric,
    CompletionRewardMetric,
    DPOMetric,
    EmbeddingMetric,
    GRPOMetric,
    LossMetric,
    TrainMetric,
)


def _room(*terms: float) -> float:
    """How far a float32 metric of these terms may be from the float64 formula of their decimal values: each term
    stored in float32 (u |x|) and a chain of at most 14 float32 operations on sums of them (each within u of
    its result, the worst case gamma_n of Higham's sums): 16 u of the sum of the terms' magnitudes."""
    return 16 * U * sum(abs(float(t)) for t in terms)


def test_accuracy_counts_next_token_hits_inside_the_completion_mask():
    labels = torch.tensor([[5, 1, 2, 3, -100]])
    logits = torch.zeros(1, 5, 6)
    for t, predicted in enumerate([1, 2, 0, 4, 0]):  # position t predicts labels[t + 1]: hits at t = 0, 1
        logits[0, t, predicted] = 9.0
    m = Accuracy(device_mesh=None, process_group=None)
    m.accumulate({"labels": labels}, {"logits": logits})
    assert m.calculate() == {"accuracy": 2 / 3} and (m.total_correct, m.total_count) == (2, 3)
    m.reset()
    mask = torch.tensor([[True, True, False, False, False]])  # only labels[1] counts: predicted at t = 0, a hit
    m.accumulate({"labels": labels, "completion_mask": mask}, {"logits": logits})
    assert m.calculate() == {"accuracy": 1.0}
    with pytest.raises(TypeError, match="takes one batch"):
        m.accumulate([{"labels": labels}], {"logits": logits})


def test_loss_metric_takes_means_or_sums_weighted_by_tokens():
    m = LossMetric(device_mesh=None, process_group=None)
    m.accumulate({}, {"loss": torch.tensor(3.0)}, loss_reduction="mean", num_tokens=3)  # sum 9 over 3
    m.accumulate({}, {"loss": torch.tensor(6.0)}, loss_reduction="sum", num_tokens=6, grad_norm=0.5)  # sum 6 over 6
    assert m.calculate() == {"loss": 15 / 9, "grad_norm": 0.5}  # 15.0 / 9.0 of exact sums: one division
    m.accumulate({}, {})
    assert (m.total_loss, m.total_count) == (15.0, 9.0)
    m.reset()
    assert (m.total_loss, m.total_count, m.calculate()) == (0.0, 0.0, {})


def test_train_metric_reports_lr_iters_and_speed():
    m = TrainMetric()
    m.accumulate({}, {}, lr=[1e-4, 2e-4], step=10, gradient_accumulation_steps=2)
    out = m.calculate()
    assert out["learning rate(param group 1)"] == 1e-4 and out["learning rate(param group 2)"] == 2e-4
    assert out["iters"] == 5 and out["speed"] > 0
    m.reset()
    assert m.last_step == 10


def test_completion_reward_metric_means_and_stds():
    m = CompletionRewardMetric()
    m.accumulate(rewards={"accuracy": [1.0, 0.0]}, completion_lengths=[10, 20])
    m.accumulate(rewards={"accuracy": [1.0]}, completion_lengths=[30], generate_time=1.5)
    out = m.calculate()
    assert out["train/accuracy_reward"] == 2 / 3  # 2.0 / 3 of exact Python sums: one division
    # float64 Python on both sides, a few operations (a few 1e-16): approx's 1e-6 is far above them
    assert out["train/accuracy_reward_std"] == pytest.approx(statistics.stdev([1.0, 0.0, 1.0]))
    assert out["train/completion_length"] == 20 and out["profiling/Time taken: generate"] == 1.5
    assert CompletionRewardMetric._mean([]) == -1.0 and CompletionRewardMetric._std([1.0]) == 0.0


def test_dpo_metric_sequence_logps_and_rewards():
    labels = torch.tensor([[1, 2, -100], [3, -100, -100], [4, 5, 6], [7, 8, -100]])
    logps = -torch.arange(12, dtype=torch.float32).reshape(4, 3) / 10
    ref = -torch.ones(4, 3) / 10
    m = DPOMetric(beta=0.5)
    m.accumulate({"labels": labels}, {"logps": logps}, ref_outputs={"logps": ref})
    pi = [-(0 + 1) / 10, -3 / 10, -(6 + 7 + 8) / 10, -(9 + 10) / 10]  # trained positions of each row
    r = [0.5 * (pi[0] + 0.2), 0.5 * (pi[1] + 0.1), 0.5 * (pi[2] + 0.3), 0.5 * (pi[3] + 0.2)]
    out = m.calculate()
    assert out["logps/chosen"] == pytest.approx((pi[0] + pi[2]) / 2, rel=0, abs=_room(*logps.flatten(), *ref[0]))
    assert out["logps/rejected"] == pytest.approx((pi[1] + pi[3]) / 2, rel=0, abs=_room(*logps.flatten(), *ref[0]))
    assert out["rewards/margins"] == pytest.approx(((r[0] - r[1]) + (r[2] - r[3])) / 2, rel=0,
                                                   abs=_room(*logps.flatten(), *ref.flatten()))
    assert out["rewards/accuracies"] == ((r[0] > r[1]) + (r[2] > r[3])) / 2  # counts of comparisons: exact
    with pytest.raises(ValueError, match="even number of rows, got 1"):
        m.accumulate({"labels": labels[:1]}, {"logps": logps[:1]})


@pytest.mark.parametrize("cls", [GRPOMetric, CISPOMetric])
def test_grpo_metric_token_means_and_k3_kl(cls):
    labels = torch.tensor([[1, 2, -100, -100], [3, 4, 5, -100]])
    new = torch.tensor([[-0.5, -1.0, 0.0, 0.0], [-0.2, -2.0, -0.1, 0.0]])
    old = torch.tensor([[-0.4, -1.5, 0.0, 0.0], [-0.2, -1.0, -0.3, 0.0]])
    entropies = torch.full((2, 4), 0.7)
    m = cls()
    m.accumulate({"labels": labels}, {"logps": new, "entropies": entropies}, old_logps=old)
    trained = [(-0.5, -0.4), (-1.0, -1.5), (-0.2, -0.2), (-2.0, -1.0), (-0.1, -0.3)]
    out = m.calculate()
    terms = _room(*new.flatten(), *old.flatten())
    assert m.n_tokens == 5 and out["train/mean_new_logp"] == pytest.approx(sum(n for n, _ in trained) / 5, rel=0,
                                                                            abs=terms)
    assert out["train/policy_confidence"] == pytest.approx(sum(math.exp(n) for n, _ in trained) / 5, rel=0,
                                                           abs=_room(*(math.exp(n) for n, _ in trained)))
    assert out["train/logp_diff_mean"] == pytest.approx(sum(n - o for n, o in trained) / 5, rel=0, abs=terms)
    k3 = [math.exp(o - n) - (o - n) - 1 for n, o in trained]
    # k3's exp(d) - d - 1 of d = o - n: its float32 d moves it by |exp(d) - 1| |dd| <= 2 |dd| for |d| <= 1
    assert out["train/approx_kl"] == pytest.approx(sum(k3) / 5, rel=0, abs=2 * terms + _room(*k3))
    assert out["train/entropy"] == pytest.approx(0.7, rel=0, abs=_room(0.7))
    per_row = [torch.tensor([-0.4, -1.5]), torch.tensor([-0.2, -1.0, -0.3])]  # each row's trained tokens
    again = cls()
    again.accumulate({"labels": labels}, {"logps": new}, old_logps=per_row)
    assert again.calculate()["train/approx_kl"] == pytest.approx(out["train/approx_kl"], rel=0, abs=2 * terms)
    m.reset()
    assert (m.n_tokens, m.sum_new, m.calculate()) == (0, 0.0, {})


def test_embedding_metric_cosines_of_query_positive_and_negatives():
    emb = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    m = EmbeddingMetric(group_size=3)
    m.accumulate({}, {"embeddings": emb, "loss": torch.tensor(2.0)})
    pos = [F.cosine_similarity(emb[g], emb[g + 1], dim=0) for g in (0, 3)]
    neg = [F.cosine_similarity(emb[g], emb[g + 2], dim=0) for g in (0, 3)]
    out = m.calculate()
    # a cosine's float32 dot product and norms of 4 terms and the mean of 2, perhaps grouped otherwise
    # (tests/rounding.py): relative to sum |x_i y_i| / (|x| |y|) <= 1 (Cauchy-Schwarz), so absolute
    room = chain_bound(4, 4, 2)
    assert out["pos_sim"] == pytest.approx(float(sum(pos) / 2), rel=0, abs=room)
    assert out["neg_sim"] == pytest.approx(float(sum(neg) / 2), rel=0, abs=room) and out["loss"] == 2.0
    assert EmbeddingMetric().calculate() == {}


def test_accuracy_of_flat_labels_is_aligned():
    logits = torch.zeros(4, 6)
    logits[torch.arange(4), torch.tensor([1, 2, 5, 4])] = 1.0  # predictions 1, 2, 5, 4
    metric = Accuracy()
    metric.update({"labels": torch.tensor([1, 2, 3, -100])}, {"logits": logits})
    assert metric.compute() == {"accuracy": 2 / 3}  # rows 0, 1 right, row 2 wrong, row 3 ignored
