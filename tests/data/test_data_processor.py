"""InputProcessor: padding values, packing layout, and packed logits == per-row logits on the tiny model."""

from __future__ import annotations

import pytest
import torch
from rounding import tiny_qwen, within

from twinkle.dataset import DataError
from twinkle.processor import InputProcessor

ROWS = [
    {"input_ids": [5, 6, 7], "labels": [-100, 6, 7]},
    {"input_ids": [8, 9], "labels": [8, 9]},
    {"input_ids": [10, 11, 12, 13], "labels": [-100, -100, 12, 13]},
]


def test_right_and_left_padding():
    right = InputProcessor(pad_token_id=1)(ROWS)
    assert right["input_ids"].tolist() == [[5, 6, 7, 1], [8, 9, 1, 1], [10, 11, 12, 13]]
    assert right["labels"].tolist() == [[-100, 6, 7, -100], [8, 9, -100, -100], [-100, -100, 12, 13]]
    assert right["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]
    assert right["position_ids"].tolist() == [[0, 1, 2, 0], [0, 1, 0, 0], [0, 1, 2, 3]]
    left = InputProcessor(padding_side="left")(ROWS[:2])
    assert left["input_ids"].tolist() == [[5, 6, 7], [0, 8, 9]]
    assert left["labels"].tolist() == [[-100, 6, 7], [-100, 8, 9]]
    assert left["attention_mask"].tolist() == [[1, 1, 1], [0, 1, 1]]
    assert InputProcessor(pad_to_multiple_of=8)(ROWS)["input_ids"].shape == (3, 8)
    assert all(t.dtype == torch.long for t in right.values())


def test_collate_fn_splits_into_micro_batches():
    """upstream Twinkle's collate_fn: a list of micro-batches, of one shared width unless variable."""
    proc = InputProcessor(pad_token_id=1)
    rows = ROWS + [{"input_ids": [14], "labels": [14]}]
    whole = proc(rows)
    fixed = proc.collate_fn(rows, micro_batch_size=2)
    assert len(fixed) == 2
    for i, mb in enumerate(fixed):  # the same rows as the whole batch, padded to its width
        assert all(torch.equal(mb[k], whole[k][2 * i:2 * i + 2]) for k in whole)
    variable = proc.collate_fn(rows, micro_batch_size=3, variable_seq_lengths=True)
    assert [mb["input_ids"].shape for mb in variable] == [(3, 4), (1, 1)]
    assert torch.equal(proc.collate_fn(rows)[0]["input_ids"], whole["input_ids"])
    packed = InputProcessor(padding_free=True).collate_fn(rows, micro_batch_size=2)
    assert [mb["input_ids"].tolist() for mb in packed] == [[[5, 6, 7, 8, 9]], [[10, 11, 12, 13, 14]]]
    with pytest.raises(ValueError, match="micro_batch_size must be a positive int or None, got 0"):
        proc.collate_fn(rows, micro_batch_size=0)


def test_completion_mask_and_ready_made_vision_tensors_are_kept():
    rows = [{"input_ids": [1, 2, 3], "completion_mask": [0, 1, 1], "pixel_values": torch.ones(4, 6),
             "image_grid_thw": torch.tensor([[1, 2, 2]])},
            {"input_ids": [4, 5], "completion_mask": [0, 1], "pixel_values": torch.zeros(8, 6),
             "image_grid_thw": torch.tensor([[1, 2, 4]])}]
    batch = InputProcessor()(rows)
    assert batch["completion_mask"].tolist() == [[0, 1, 1], [0, 1, 0]]
    assert batch["completion_mask"].dtype == torch.long
    assert torch.equal(batch["pixel_values"], torch.cat([torch.ones(4, 6), torch.zeros(8, 6)]))
    assert batch["image_grid_thw"].tolist() == [[1, 2, 2], [1, 2, 4]]
    packed = InputProcessor(padding_free=True)(rows)
    assert packed["completion_mask"].tolist() == [[0, 1, 1, 0, 1]]


def test_packing_restarts_positions_and_masks_sequence_starts():
    packed = InputProcessor(padding_free=True)(ROWS)
    assert set(packed) == {"input_ids", "labels", "position_ids"}
    assert packed["input_ids"].tolist() == [[5, 6, 7, 8, 9, 10, 11, 12, 13]]
    assert packed["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3]]
    assert packed["labels"].tolist() == [[-100, 6, 7, -100, 9, -100, -100, 12, 13]]


def test_template_pad_id_and_unlabelled_rows(embedded_template):
    processor = InputProcessor.for_template(embedded_template)
    assert processor.pad_token_id == embedded_template.tokenizer.pad_token_id == 0
    batch = processor([{"input_ids": [3, 4]}, {"input_ids": [5]}])
    assert "labels" not in batch and batch["input_ids"].tolist() == [[3, 4], [5, 0]]


@pytest.mark.parametrize(("rows", "message"), [
    ([], r"non-empty list of encoded rows"),
    ([{"messages": []}], r"row 0 of the batch has no 'input_ids' \(got \['messages'\]\).*encode"),
    ([{"input_ids": []}], r"empty input_ids"),
    ([{"input_ids": [1, 2], "labels": [1]}], r"1 labels for 2 input_ids"),
    ([{"input_ids": [1], "labels": [1]}, {"input_ids": [2]}], r"some rows of the batch have labels"),
])
def test_bad_batches(rows, message):
    with pytest.raises(DataError, match=message):
        InputProcessor()(rows)


def packed_inputs(batch):
    return {k: v for k, v in batch.items() if k != "labels"}


def test_packed_forward_equals_separate_rows(embedded_template, multi_turn):
    """The packed layout is one HF's models read as separate sequences (no attention across them).

    transformers detects packing from position_ids when there is no attention_mask and no KV cache,
    so a training forward passes use_cache=False.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from twinkle.assets import asset_path

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(asset_path("tiny-qwen"))
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config).eval()
    rows = [embedded_template.encode({"messages": multi_turn[: 3 + 2 * k]}) for k in range(3)]
    packed = InputProcessor(padding_free=True)(rows)
    with torch.no_grad():
        packed_logits = model(**packed_inputs(packed), use_cache=False).logits[0]
        separate = [model(input_ids=torch.tensor([r["input_ids"]]), use_cache=False).logits[0] for r in rows]
        padded = InputProcessor()(rows)
        padded_logits = model(**packed_inputs(padded), use_cache=False).logits
        across = model(input_ids=packed["input_ids"], use_cache=False).logits[0]  # one sequence: rows attend back
    # the same forward sums grouped otherwise (a longer row with a block mask, another matmul length): a
    # forward's bound of the tiny model over the pack's tokens (tests/rounding.py), elementwise by within()
    rel = tiny_qwen(packed["input_ids"].shape[1], 1).forward_bound()
    want = torch.cat(separate)
    torch.testing.assert_close(packed_logits, want, **within(rel, want))
    for i, logits in enumerate(separate):
        torch.testing.assert_close(padded_logits[i, : len(logits)], logits, **within(rel, logits))
    # attention across the rows (the mistake the layout prevents) moves the later rows' logits far beyond it
    later = slice(len(separate[0]), None)
    assert float((across[later] - want[later]).abs().max()) > 100 * within(rel, want)["atol"]
