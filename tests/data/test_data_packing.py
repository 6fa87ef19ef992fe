"""PackingDataset: best-fit-decreasing packs, the fill ratio, and packs through the padding-free path."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rounding import U, tiny_qwen

from twinkle.constants import IGNORE_INDEX
from twinkle.dataloader import DataLoader
from twinkle.dataset import DataError, DatasetMeta, PackingDataset
from twinkle.dataset.packing import pack_lengths, pack_row
from twinkle.preprocessor import SelfCognitionProcessor
from twinkle.processor import InputProcessor


def realistic_lengths(n: int, seed: int = 0) -> list[int]:
    """SFT-like lengths: log-normal, most rows a few hundred tokens, a tail up to 8,000."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(mean=6.0, sigma=1.0, size=n), 20, 8000).astype(int).tolist()


def test_packs_hold_every_row_once_within_the_budget_and_fill_well():
    lengths = realistic_lengths(20_000)
    packs = pack_lengths(lengths, 8192)
    members = sorted(i for p in packs for i in p)
    assert members == list(range(len(lengths)))
    assert max(sum(lengths[i] for i in p) for p in packs) <= 8192
    fill = sum(lengths) / (len(packs) * 8192)
    assert fill >= 0.95, fill
    # never more packs than first-fit would need (best fit is at least as tight here), and at least the bound
    assert len(packs) >= -(-sum(lengths) // 8192)
    assert pack_lengths(lengths, 8192) == packs  # a pure function of the lengths


def test_small_instance_is_packed_optimally():
    # 6+4, 5+5, 7+3: best fit decreasing finds the 3 full packs (first fit on the input order needs 4)
    assert sorted(sorted(p) for p in pack_lengths([6, 5, 7, 4, 5, 3], 10)) == [[0, 3], [1, 4], [2, 5]]


def test_bad_lengths_and_budgets_are_refused():
    with pytest.raises(DataError, match="row 1 has 11 tokens; packing needs 1..max_length=10"):
        pack_lengths([3, 11], 10)
    with pytest.raises(DataError, match="positive integer"):
        pack_lengths([3], 0)
    with pytest.raises(DataError, match=r"cannot pack a row with columns \['images'\]"):
        pack_row([{"input_ids": [1], "labels": [1], "images": ["a.png"]}])


def test_pack_row_restarts_positions_and_the_processor_masks_each_start():
    rows = [{"input_ids": [5, 6, 7], "labels": [5, 6, 7], "length": 3},
            {"input_ids": [8, 9], "labels": [-100, 9], "length": 2}]
    pack = pack_row(rows)
    assert pack == {"input_ids": [5, 6, 7, 8, 9], "labels": [5, 6, 7, -100, 9], "position_ids": [0, 1, 2, 0, 1],
                    "length": 5}
    batch = InputProcessor(padding_free=True)([pack, rows[1]])
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1]]
    assert batch["labels"].tolist() == [[IGNORE_INDEX, 6, 7, IGNORE_INDEX, 9, IGNORE_INDEX, 9]]
    assert "attention_mask" not in batch
    with pytest.raises(DataError, match="packs need InputProcessor\\(padding_free=True\\)"):
        InputProcessor()([pack])


@pytest.fixture(scope="module")
def packed() -> PackingDataset:
    data = PackingDataset(DatasetMeta("twinkle://self-cognition", data_slice=range(24)))
    data.set_template("Qwen2_5Template", model_id="twinkle://tiny-qwen", max_length=160)
    data.map(SelfCognitionProcessor("twinkle", "ModelScope"))
    data.encode()
    return data


def test_pack_dataset_reports_and_indexes_packs(packed):
    rows = packed.hf_dataset.to_list()  # the encoded rows under the packs
    report = packed.pack_dataset()
    assert report.rows == 24 and report.packs == len(packed) < 24
    assert report.tokens == sum(r["length"] for r in rows)
    assert report.fill_ratio == report.tokens / (report.packs * 160)  # one division of integers: exact
    seen = []
    for pack in packed:
        assert pack["length"] == len(pack["input_ids"]) <= 160
        starts = [i for i, p in enumerate(pack["position_ids"]) if p == 0]
        seen += [pack["input_ids"][a:b] for a, b in zip(starts, starts[1:] + [pack["length"]])]
    assert sorted(seen) == sorted(r["input_ids"] for r in rows)  # every row once, whole
    with pytest.raises(DataError, match="needs a token budget"):
        bare = PackingDataset(DatasetMeta(data=[{"messages": []}]))
        bare.set_template("Template")
        bare.pack_dataset()


def _train(model, batches):
    losses = []
    for batch in batches:
        losses.append(model.forward_backward(inputs=batch))
        model.step()
        model.zero_grad()
    return losses


def test_training_on_packs_equals_training_on_the_same_rows_unpacked(packed):
    """Two SGD steps on batches of packs vs the same rows padded: the same losses and weights.

    Bound: both runs compute the same per-token terms; only float32 reduction order differs (attention over a
    longer row with a block mask, matmuls over a different sequence length): a step of the tiny model on 2 packs
    of <= 160 tokens (tests/rounding.py), the second step carrying the first's rounding twice. SGD (lr 0.5, no
    clipping) moves a weight by lr * g, so each tensor's difference is within that relative bound of its update,
    plus float32 storage of each step's weight.
    """
    from twinkle_hf.model import TransformersModel

    packed.pack_dataset()
    loader = DataLoader(packed, batch_size=2, shuffle=False)
    pack_batches = [next(iter(loader)) for _ in range(2)]
    member_rows = [[r for m in packed._packs[2 * b:2 * b + 2] for r in packed.hf_dataset.select(m).to_list()]
                   for b in range(2)]
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = TransformersModel(model_id="twinkle://tiny-qwen", mixed_precision="no")
        model.set_optimizer("SGD", lr=0.5)
        models.append(model)
    models[0].set_processor("InputProcessor", padding_free=True)
    packed_losses = _train(models[0], pack_batches)
    assert models[0].optimizer_group["default"].last_inputs["input_ids"].shape[0] == 1
    padded_losses = _train(models[1], member_rows)
    bound = (2 * 1 + 1) * tiny_qwen(160, 2).step_bound()
    assert packed_losses == pytest.approx(padded_losses, rel=bound, abs=0)
    a, b = models[0].get_state_dict(), models[1].get_state_dict()
    torch.manual_seed(0)
    initial = TransformersModel(model_id="twinkle://tiny-qwen", mixed_precision="no").get_state_dict()
    moved, worst = 0, 0.0
    for key in a:
        update = float((b[key] - initial[key]).norm())
        room = bound * update + 2 * U * float(b[key].norm())
        diff = float((a[key] - b[key]).norm())
        worst = max(worst, diff / room)
        assert diff <= room, key
        moved += update > 100 * room
    print(f"losses {packed_losses} vs {padded_losses} (bound {bound:.1e} rel); weights at most {worst:.2e} of room")
    # the steps moved most tensors far beyond their room, so the comparison could fail
    assert moved > len(a) // 2, (moved, len(a))


def test_rl_rows_pack_whole_with_their_per_token_fields():
    """RL rows carry per-token fields; a pack keeps each row whole and its fields aligned with its tokens,
    and the losses' sequence view finds every row as one sequence."""
    from twinkle.loss.token_inputs import segment_ids

    rows = [{"input_ids": list(range(10 * k + 1, 10 * k + 1 + n)), "labels": list(range(10 * k + 1, 10 * k + 1 + n)),
             "advantages": [float(k)] * n, "weights": [1.0] * n} for k, n in enumerate([5, 3, 7, 2, 6])]
    packs = [pack_row([rows[i] for i in p]) for p in pack_lengths([len(r["input_ids"]) for r in rows], 10)]
    batch = InputProcessor(padding_free=True)(packs)
    segments = segment_ids(batch, batch["input_ids"].shape, torch.device("cpu"))[0].tolist()
    ids, adv = batch["input_ids"][0].tolist(), batch["advantages"][0].tolist()
    found = {}
    for seg, tok, a in zip(segments, ids, adv):
        found.setdefault(seg, []).append((tok, a))
    assert sorted(found.values()) == sorted([(t, r["advantages"][0]) for t in r["input_ids"]] for r in rows)
