"""max_length with every truncation strategy, on single rows and through Dataset.encode."""

from __future__ import annotations

import pytest

from twinkle.dataset import DataError, Dataset, DatasetMeta
from twinkle.template import Template


@pytest.fixture
def full(embedded_template, multi_turn):
    return embedded_template.encode({"messages": multi_turn})


def _template(tokenizer, max_length, strategy):
    return Template(tokenizer=tokenizer, max_length=max_length, truncation_strategy=strategy)


def test_raise_names_the_row_and_the_fix(tokenizer, multi_turn, full):
    template = _template(tokenizer, 10, "raise")
    with pytest.raises(DataError, match=rf"row 7 encodes to {full['length']} tokens, more than max_length=10.*'left'"):
        template.batch_encode([{"messages": multi_turn}], indices=[7])


def test_left_keeps_the_end_and_right_keeps_the_start(tokenizer, multi_turn, full):
    n = full["length"] - 5
    left = _template(tokenizer, n, "left").encode({"messages": multi_turn})
    right = _template(tokenizer, n, "right").encode({"messages": multi_turn})
    assert left["input_ids"] == full["input_ids"][-n:] and left["labels"] == full["labels"][-n:]
    assert right["input_ids"] == full["input_ids"][:n] and right["labels"] == full["labels"][:n]
    for row in (left, right):
        assert row["length"] == n and row["position_ids"] == list(range(n)) and row["attention_mask"] == [1] * n


def test_rows_within_max_length_are_untouched(tokenizer, multi_turn, full):
    for strategy in ("raise", "left", "right", "delete"):
        assert _template(tokenizer, full["length"], strategy).encode({"messages": multi_turn}) == full


def test_delete_and_no_trained_token_are_counted_skips(tokenizer, multi_turn, full, twinkle_log):
    short = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    assert _template(tokenizer, 10, "delete").batch_encode([{"messages": multi_turn}]) == [
        (None, "longer than max_length=10")]
    # keeping only the start cuts away every assistant token
    assert _template(tokenizer, 12, "right").batch_encode([{"messages": multi_turn}]) == [
        (None, "no trained token left after truncation")]

    rows = [{"messages": multi_turn}] * 3 + [{"messages": short}] * 2
    ds = Dataset(DatasetMeta(data=rows))
    ds.set_template(Template(tokenizer=tokenizer, max_length=full["length"] - 1, truncation_strategy="delete"))
    ds.map("MessagesProcessor")
    ds.encode()
    assert len(ds) == 2
    assert all(ds[i]["length"] < full["length"] for i in range(2))
    assert "dropped 3 of 5 rows (3 longer than max_length=" in twinkle_log.text


def test_encode_that_drops_every_row_is_an_error_and_keeps_the_dataset(tokenizer, multi_turn):
    ds = Dataset(DatasetMeta(data=[{"messages": multi_turn}] * 2)).map("MessagesProcessor")
    ds.set_template(Template(tokenizer=tokenizer, max_length=5, truncation_strategy="delete"))
    with pytest.raises(DataError, match="dropped every row"):
        ds.encode()
    assert ds.column_names == ["messages", "tools"] and len(ds) == 2


def test_bad_template_settings_are_rejected(tokenizer):
    with pytest.raises(ValueError, match="truncation_strategy='middle'; choose one of raise, left, right, delete"):
        Template(tokenizer=tokenizer, truncation_strategy="middle")
    with pytest.raises(ValueError, match="max_length must be a positive integer"):
        Template(tokenizer=tokenizer, max_length=0)
    with pytest.raises(ValueError, match="train_turns"):
        Template(tokenizer=tokenizer, train_turns="first")
