"""Rows that belong together (a chosen/rejected pair) pack whole: never split over packs, adjacent and in order,
and a DPO step on the packs equals the step on the same pairs unpacked."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from twinkle.dataloader import DataLoader
from twinkle.dataset import DataError, Dataset, DatasetMeta, IterablePackingDataset, PackingDataset
from twinkle.dataset.packing import pack_groups, pack_row

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: rounding.py
from rounding import U, tiny_qwen  # noqa: E402

PAIRS = [{"prompt": f"question {i} " + "why " * (i % 4), "chosen": "yes " * (1 + i % 5),
          "rejected": "no " * (1 + (i * 3) % 7)} for i in range(8)]
BUDGET = 96


def pairs_of(pack_members, groups):
    """Each pack's group ids in order; every group must be two adjacent rows (chosen then rejected)."""
    out = []
    for members in pack_members:
        ids = [groups[i] for i in members]
        assert all(ids[k] == ids[k + 1] for k in range(0, len(ids), 2)), ids
        assert all(members[k] + 1 == members[k + 1] for k in range(0, len(ids), 2)), members  # chosen first
        out.append(ids[0::2])
    return out


def test_groups_pack_whole_adjacent_and_in_order():
    # rows 1..2 and 4..6 are groups; packing the rows alone would split them (6 + 5 fills a pack of 11)
    lengths, groups = [6, 3, 2, 5, 1, 1, 4], [None, "a", "a", None, "b", "b", "b"]
    packs = pack_groups(lengths, groups, 11)
    assert sorted(i for p in packs for i in p) == list(range(7))
    for pack in packs:
        assert sum(lengths[i] for i in pack) <= 11
        for group in ("a", "b"):
            at = [i for i in pack if groups[i] == group]
            assert at in ([], [i for i, g in enumerate(groups) if g == group])  # all of it, in its order
            if at:
                start = pack.index(at[0])
                assert pack[start:start + len(at)] == at  # adjacent
    assert pack_groups(lengths, None, 11) == pack_groups(lengths, [None] * 7, 11)  # no group: the row packer
    with pytest.raises(DataError, match=r"rows 4\.\.6 share group_id 'b' and have 6 tokens together"):
        pack_groups([1, 1, 1, 1, 1, 1, 4], groups, 5)
    assert "group_id" not in pack_row([{"input_ids": [1], "labels": [1], "group_id": 3}])


@pytest.fixture(scope="module")
def packed():
    data = PackingDataset(DatasetMeta(data=PAIRS))
    data.set_template("Qwen2_5Template", model_id="twinkle://tiny-qwen", max_length=BUDGET)
    data.encode()  # chosen/rejected columns: each row encodes to its pair, group_id = the row
    return data


def test_encoded_pairs_never_split_by_packing(packed):
    rows = packed.hf_dataset.to_list()
    assert [r["group_id"] for r in rows] == [i for i in range(len(PAIRS)) for _ in range(2)]
    report = packed.pack_dataset()
    groups = [r["group_id"] for r in rows]
    per_pack = pairs_of(packed._packs, groups)
    assert sorted(g for p in per_pack for g in p) == list(range(len(PAIRS)))  # each pair in exactly one pack
    # packing the rows without their groups would split some pair here, so the test can fail
    loose = pack_groups([r["length"] for r in rows], None, BUDGET)
    assert any(sum(groups[i] == g for i in p) == 1 for p in loose for g in range(len(PAIRS)))
    assert report.rows == 2 * len(PAIRS) and report.packs < len(PAIRS)
    mixed = PackingDataset(DatasetMeta(data=PAIRS[:4])).add_dataset(DatasetMeta(data=PAIRS[4:]))
    mixed.set_template("Qwen2_5Template", model_id="twinkle://tiny-qwen", max_length=BUDGET)
    mixed.encode()
    mixed.mix_dataset(interleave=True)
    with pytest.raises(DataError, match="interleaving row by row would separate a group's rows"):
        len(mixed)


def test_a_pack_stream_keeps_groups_whole_across_its_buffers(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in PAIRS))
    reference = PackingDataset(DatasetMeta(data=PAIRS))
    reference.set_template("Qwen2_5Template", model_id="twinkle://tiny-qwen", max_length=BUDGET)
    reference.encode()
    rows = reference.hf_dataset.to_list()
    expected = sorted((rows[2 * i]["input_ids"], rows[2 * i + 1]["input_ids"]) for i in range(len(PAIRS)))
    # preference rows, each encoded to its pair as it streams
    encoded = IterablePackingDataset(DatasetMeta(str(path)), packing_interval=3)
    encoded.set_template("Qwen2_5Template", model_id="twinkle://tiny-qwen", max_length=BUDGET)
    encoded.pack_dataset()
    assert sorted(p for pack in encoded for p in pair_seqs(pack)) == expected
    # the same pairs stored as two rows marked by group_id: buffers of 3 rows cut every other pair
    answers = path.parent / "answers.jsonl"
    answers.write_text("".join(json.dumps({"group_id": i, "messages": [
        {"role": "user", "content": r["prompt"]}, {"role": "assistant", "content": r[key]}]}) + "\n"
        for i, r in enumerate(PAIRS) for key in ("chosen", "rejected")))
    marked = IterablePackingDataset(DatasetMeta(str(answers)), packing_interval=3)
    marked.set_template("Qwen2_5Template", model_id="twinkle://tiny-qwen", max_length=BUDGET)
    marked.pack_dataset()
    plain = Dataset(DatasetMeta(str(answers)))
    plain.set_template("Qwen2_5Template", model_id="twinkle://tiny-qwen", max_length=BUDGET)
    plain.encode()
    assert plain[0]["group_id"] == 0  # kept through encode
    # a chosen row encoded alone differs from the pair's (its answer trained the same): compare the rows
    pairs = sorted((plain[2 * i]["input_ids"], plain[2 * i + 1]["input_ids"]) for i in range(len(PAIRS)))
    assert sorted(p for pack in marked for p in pair_seqs(pack)) == pairs


def pair_seqs(pack):
    """The pack's sequences two by two (a pair's rows must be adjacent, chosen first)."""
    starts = [k for k, p in enumerate(pack["position_ids"]) if p == 0]
    seqs = [pack["input_ids"][a:b] for a, b in zip(starts, starts[1:] + [pack["length"]])]
    assert len(seqs) % 2 == 0, len(seqs)
    return [(seqs[k], seqs[k + 1]) for k in range(0, len(seqs), 2)]


def _dpo_model():
    from peft import LoraConfig

    from twinkle.model import TransformersModel

    torch.manual_seed(0)
    model = TransformersModel(model_id="twinkle://tiny-qwen", mixed_precision="no")
    torch.manual_seed(1)
    model.add_adapter_to_model("policy", LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    model.set_optimizer("SGD", lr=LR, adapter_name="policy")
    model.set_loss("dpo", adapter_name="policy", beta=0.1)
    return model


LR, STEPS = 0.5, 2


def test_dpo_on_packs_equals_dpo_on_the_pairs_unpacked(packed):
    """Two SGD steps of DPO (the reference: the base, adapter off) on one batch of packs vs the same pairs padded.

    Bound (tests/rounding.py): both runs compute the same per-token terms and differ only in float32 reduction
    order (attention and matmuls over one long row vs padded rows), so one step's loss and gradient differ by at
    most ``step_bound()`` relative for the tiny Qwen on these 16 rows of <= 96 tokens; under SGD the error of
    step k is k times that (the update is linear in the gradient), as in tests/golden/golden_bounds.py. The loss,
    a mean of -log sigma(z) with |dloss/dz| <= 1, gets that room times max(|loss|, 1). LoRA updates compare by
    their per-tensor norms (l2 of w_final - w_initial), within rel * l2 plus the float32 storage of the weight
    (STEPS * u * |w|). The bound is required far below what one step changes.
    """
    packed.pack_dataset()
    rows = packed.hf_dataset.to_list()
    shape = tiny_qwen(seq=BUDGET, rows=len(rows))  # every row (and pack) has <= BUDGET tokens: an over-estimate
    rel = STEPS * shape.step_bound()
    pack_batch = next(iter(DataLoader(packed, batch_size=len(packed), shuffle=False)))
    unpacked = [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in rows]
    runs = []
    for batch, padding_free in ((pack_batch, True), (unpacked, False)):
        model = _dpo_model()
        model.set_processor("InputProcessor", padding_free=padding_free, adapter_name="policy")
        initial = {k: v.clone() for k, v in model.get_state_dict(adapter_name="policy").items()}
        losses, norms = [], []
        for _ in range(STEPS):
            losses.append(float(model.forward_backward(inputs=batch, adapter_name="policy")))
            model.clip_grad_and_step(max_grad_norm=1e6, adapter_name="policy")  # computes the norm, never clips
            norms.append(float(model.calculate_metric(True, adapter_name="policy")["grad_norm"]))
        final = model.get_state_dict(adapter_name="policy")
        runs.append((losses, norms, initial, final))
        if padding_free:
            assert model.optimizer_group["policy"].last_inputs["input_ids"].shape[0] == 1  # one packed row
    (lp, gp, init, fp), (lu, gu, _, fu) = runs
    assert lp[0] == pytest.approx(math.log(2), abs=1e-6)  # the adapter starts at zero: policy == reference
    for a, b in zip(lp, lu):
        assert abs(a - b) <= rel * max(abs(b), 1), (lp, lu, rel)
    for a, b in zip(gp, gu):
        assert abs(a - b) <= rel * b, (gp, gu, rel)
    moved = 0
    for key in fp:
        dp, du = (fp[key] - init[key]).norm().item(), (fu[key] - init[key]).norm().item()
        room = rel * du + STEPS * U * fu[key].norm().item()
        assert abs(dp - du) <= room, (key, dp, du, room)
        moved += du > 10 * room
    assert moved >= len(fp) // 2  # the updates are far beyond their room: the comparison can fail
    # what one step changes the loss by (first order: lr * |g|^2) is far above the loss's room
    assert LR * gu[0] ** 2 >= 10 * rel * max(abs(lu[0]), 1), (gu[0], rel)
    assert abs(lp[1] - lp[0]) > 10 * rel * max(abs(lu[1]), 1)
