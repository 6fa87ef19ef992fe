"""Context parallelism, the part a CPU can check: what each CP rank is given, and that the loss adds up.

CP attention needs Transformer Engine on a GPU (megatron-core's local ``DotProductAttention`` asserts
``context_parallel_size == 1``), so here one process plays every CP rank in turn: the model's sizes
say ``cp`` ranks and this process is rank ``r``. The references are independent: megatron's
load-balanced layout written out as a formula (rank r holds chunks r and 2cp-1-r of 2cp), the
original rows, and twinkle's CrossEntropyLoss / TokenAccuracy on the whole rows.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
from megatron_testing import VOCAB, hf_model, make_batch, megatron_model, save_hf, scheduled_on_cpu
from rounding import U, chain_bound

from twinkle.loss import CrossEntropyLoss, Loss
from twinkle.metric import TokenAccuracy
from twinkle_megatron.errors import MegatronConfigError
from twinkle_megatron.model import vocab_parallel as vp


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return megatron_model(save_hf(hf_model("qwen2"), tmp_path_factory.mktemp("cp")))


@pytest.fixture
def as_rank(model):
    """``as_rank(cp, r, **sizes)``: the model believes it is context-parallel rank r of cp (restored afterwards)."""
    backend = model.backend
    sizes, ranks = backend.sizes, backend.ranks

    def play(cp: int, rank: int, **more) -> None:
        backend.sizes = dataclasses.replace(sizes, cp=cp, **more)
        backend.ranks = dataclasses.replace(ranks, cp=rank)

    yield play
    backend.sizes, backend.ranks = sizes, ranks


def expected_positions(length: int, cp: int, rank: int) -> list[int]:
    chunk = length // (2 * cp)
    chunks = [list(range(i * chunk, (i + 1) * chunk)) for i in range(2 * cp)]
    return chunks[rank] + chunks[2 * cp - 1 - rank]


def _pieces(model, as_rank, batch, cp, **more):
    group = model.optimizer_group["default"]
    out = []
    for rank in range(cp):
        as_rank(cp, rank, **more)
        (piece,) = model.backend.prepare(dict(batch), group, "causal_lm", {})  # megatron's layout of the batch
        out.append(piece)
    return out


@pytest.mark.parametrize("cp", [2, 3])
def test_every_token_is_on_exactly_one_rank_at_its_original_position(model, as_rank, cp):
    batch = make_batch(seed=1, rows=3, length=13)  # 13 is no multiple of 2*cp: rows are padded first
    length = -(-13 // (2 * cp)) * (2 * cp)
    pieces = _pieces(model, as_rank, batch, cp)
    seen = []
    for rank, piece in enumerate(pieces):
        positions = expected_positions(length, cp, rank)
        assert piece["position_ids"].tolist() == [positions] * 3  # the positions RoPE gives these tokens
        seen += positions
        for row in range(3):
            for i, p in enumerate(positions):
                original = p < 13
                assert int(piece["input_ids"][row, i]) == (int(batch["input_ids"][row, p]) if original else 0)
                assert int(piece["attention_mask"][row, i]) == (int(batch["attention_mask"][row, p]) if original else 0)
                # what the logits at p predict: the label of p + 1, even when p + 1 lives on another rank
                label = int(batch["labels"][row, p + 1]) if p + 1 < 13 else -100
                assert int(piece[vp.NEXT_LABELS][row, i]) == label
    assert sorted(seen) == list(range(length))
    assert sum(int(p["attention_mask"].sum()) for p in pieces) == int(batch["attention_mask"].sum())


def test_sequence_parallel_pads_to_a_multiple_of_tp_on_every_cp_rank(model, as_rank):
    pieces = _pieces(model, as_rank, make_batch(seed=2, rows=2, length=13), 2, tp=2, sequence_parallel=True)
    assert [p["input_ids"].shape[1] for p in pieces] == [8, 8]  # 13 -> 16 = 2 * cp * tp, 8 per rank


def test_losses_and_accuracy_of_the_rank_shares_add_up_to_the_whole_rows(model, as_rank):
    batch = make_batch(seed=3, rows=3, length=16)
    logits = torch.randn(3, 16, VOCAB, generator=torch.Generator().manual_seed(0))
    reference, items = CrossEntropyLoss().compute(batch, {"logits": logits})
    accuracy = TokenAccuracy()
    accuracy.update(batch, {"logits": logits})
    group = model.optimizer_group["default"]
    total, counted, correct = 0.0, 0, 0
    for rank, piece in enumerate(_pieces(model, as_rank, batch, 2)):
        as_rank(2, rank)
        shard = logits[:, piece["position_ids"][0]].clone()  # what this rank's forward computes
        correct += int(vp.argmax_matches(shard, piece[vp.NEXT_LABELS], -100)[0])
        loss_fn = model.backend.loss_for(group, "causal_lm", consumable=True)
        loss, n = loss_fn.compute(piece, model.backend.logits_outputs(shard))
        total, counted = total + float(loss), counted + int(n)
    assert counted == int(items)
    # the same logits: each log-sum-exp (VOCAB terms) and the sum over 48 tokens in another grouping
    assert total == pytest.approx(float(reference), rel=chain_bound(VOCAB, 3 * 16))
    assert correct == int(accuracy._correct)


class _OwnLoss(Loss):
    def compute(self, inputs, outputs, **kwargs):
        return outputs["logits"].sum(), 1


def test_a_custom_loss_is_refused_under_context_parallelism(model, as_rank):
    piece = _pieces(model, as_rank, make_batch(seed=4), 2)[1]
    group = model.optimizer_group["default"]
    outputs = model.backend.logits_outputs(torch.randn(4, 6, VOCAB))
    with pytest.raises(MegatronConfigError, match="full logits are not assembled"):
        outputs["logits"]
    group.loss = _OwnLoss()
    try:
        with pytest.raises(MegatronConfigError, match=r"cp_size=2 .* only the default CrossEntropyLoss"):
            model.backend.loss_for(group, "causal_lm", consumable=True).compute(piece, outputs)
    finally:
        group.loss = None


def two_like_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The context-parallel group and the data x context group act as two ranks holding this rank's values: a sum
    over either doubles (the other rank's share is a copy of this one's). Other groups are untouched. (Called
    once the model is built: building it makes megatron's groups anew.)"""
    from megatron.core import parallel_state as ps

    from twinkle import collective

    doubled = {id(ps.get_context_parallel_group()), id(ps.get_data_parallel_group(with_context_parallel=True))}
    active, reduce = collective.active, collective._all_reduce

    def fake_reduce(tensor, op, group, owned):
        if id(group) not in doubled:
            return reduce(tensor, op, group, owned)
        return tensor * 2 if op == "sum" else tensor.clone()

    monkeypatch.setattr(collective, "active", lambda group=None: id(group) in doubled or active(group))
    monkeypatch.setattr(collective, "_all_reduce", fake_reduce)


@pytest.mark.parametrize("path", ["eager", "scheduled"])
def test_the_gradient_is_the_token_mean_over_the_context_ranks(tmp_path, monkeypatch, path):
    """CP=2, the other rank a copy of this one: the summed gradients (2 g) over the summed tokens (2 n) must be
    this rank's own token-mean gradient g / n. The reference is computed by hand: the rank's piece through the
    model and the loss, its mean back-propagated. A count summed over CP twice gives exactly half of it.

    Tolerance: the two gradients are the same sums, the 1/n factor applied at the loss instead of after
    backward; each of the at most ~50 roundings between the loss and a weight's gradient may differ by one
    fp32 ulp, so rtol = 50 * 2**-24 (3e-6), rounded up to 1e-5 and applied to the gradient's scale."""
    model = megatron_model(save_hf(hf_model("qwen2", seed=4), tmp_path))
    backend, group = model.backend, model.optimizer_group["default"]
    backend.sizes = dataclasses.replace(backend.sizes, cp=2)  # this process plays CP rank 0 of 2
    backend.ranks = dataclasses.replace(backend.ranks, cp=0)
    two_like_ranks(monkeypatch)
    model.set_optimizer("default", lr=1e-3)  # the CPU driver sees the (faked) groups as it is built
    batch = make_batch(seed=9, rows=3, length=16)
    params = [p for p in model.gpt.parameters() if p.requires_grad]

    (piece,) = backend.prepare(dict(batch), group, "causal_lm", {})
    outputs = backend.run("causal_lm", piece, True, {})
    total, items = vp.VocabParallelCrossEntropy().compute(piece, outputs)
    (total / items).backward()
    reference = [p.grad.clone() for p in params]
    for param in params:
        param.grad = None

    with scheduled_on_cpu() if path == "scheduled" else contextlib.nullcontext():
        assert backend.schedules == (path == "scheduled")
        loss = model.forward_backward(inputs=batch)
    assert int(model.optimizer_group["default"].window_items) == int(items)  # this rank's own tokens
    model.clip_grad_norm(1e9)  # finishes the gradients (finalize) without clipping
    scale = max(float(g.abs().max()) for g in reference)
    for param, expected in zip(params, reference):
        torch.testing.assert_close(param.grad, expected, rtol=1e-5, atol=1e-5 * scale)
    # the same forward's token sum and count (the fake reduce doubles both exactly): one quotient, rounded to
    # float32 on one side and perhaps not on the other (at most u each)
    assert float(loss) == pytest.approx(float(total / items), rel=2 * U, abs=0)
