"""Dataset.map with batched functions (dict of columns in, dict of columns out) and per-row ones."""

from __future__ import annotations

import pytest

from twinkle.dataset import DataError, Dataset, DatasetMeta

ROWS = [{"text": t, "label": i} for i, t in enumerate(["Hello world", "Test data", "abc", "a longer line"])]


def to_messages(batch):
    """Upstream Twinkle's batched style: a dict of lists in, a dict of lists out."""
    return {"messages": [[{"role": "user", "content": t}, {"role": "assistant", "content": "ok"}]
                         for t in batch["text"]]}


def expected_messages():
    return [[{"role": "user", "content": r["text"]}, {"role": "assistant", "content": "ok"}] for r in ROWS]


def test_batched_function_with_batched_true_maps_every_row_and_keeps_other_columns():
    ds = Dataset(DatasetMeta(data=ROWS)).map(to_messages, batched=True, batch_size=3)
    assert [r["messages"] for r in ds] == expected_messages()
    assert [r["label"] for r in ds] == [0, 1, 2, 3]


def test_batched_function_without_the_flag_is_read_as_batched():
    """Called per row it would turn 'Hello world' into 11 message lists; the probe reads it batched
    (upstream Twinkle's convention for plain functions), not per row."""
    ds = Dataset(DatasetMeta(data=ROWS)).map(to_messages)
    assert [r["messages"] for r in ds] == expected_messages()


def test_per_row_functions_still_work_without_the_flag():
    ds = Dataset(DatasetMeta(data=ROWS)).map(lambda row: {"n": len(row["text"])})
    assert [r["n"] for r in ds] == [len(r["text"]) for r in ROWS]
    # works either way (passes values through): read as per-row
    ds = Dataset(DatasetMeta(data=ROWS)).map(lambda row: {"copy": row["text"]})
    assert [r["copy"] for r in ds] == [r["text"] for r in ROWS]


def test_a_function_that_only_works_on_batches_is_detected():
    def upper(batch):
        return {"text": [t.upper() for t in batch["text"]]}  # per row: iterates characters -> a list

    def lengths(batch):
        return {"n": [len(t) for t in batch["text"]], "label": batch["label"] + []}  # per row: int + list fails

    ds = Dataset(DatasetMeta(data=ROWS)).map(lengths)
    assert [r["n"] for r in ds] == [len(r["text"]) for r in ROWS]
    assert [r["text"] for r in Dataset(DatasetMeta(data=ROWS)).map(upper)] == [r["text"].upper() for r in ROWS]


def test_batched_split_and_drop_change_the_row_count():
    def split_words(batch):
        return {"word": [w for t in batch["text"] for w in t.split()]}

    words = [w for r in ROWS for w in r["text"].split()]
    ds = Dataset(DatasetMeta(data=ROWS)).map(split_words, batched=True, batch_size=2,
                                             remove_columns=["text", "label"])
    assert [r["word"] for r in ds] == words
    assert ds.column_names == ["word"]

    def drop_short(batch):
        keep = [i for i, t in enumerate(batch["text"]) if len(t) > 3]
        return {k: [v[i] for i in keep] for k, v in batch.items()}

    ds = Dataset(DatasetMeta(data=ROWS)).map(drop_short, batched=True)
    assert [r["text"] for r in ds] == [r["text"] for r in ROWS if len(r["text"]) > 3]


def test_batched_count_change_without_the_other_columns_is_refused():
    def split_words(batch):
        return {"word": [w for t in batch["text"] for w in t.split()]}

    ds = Dataset(DatasetMeta(data=ROWS))
    with pytest.raises(DataError, match=r"map\(split_words, batched=True\) returned .* rows for a batch of .*"
                                        r"remove_columns=\['text', 'label'\]"):
        ds.map(split_words, batched=True)
    with pytest.raises(DataError, match="returns a dict of columns"):
        ds.map(lambda batch: [1, 2], batched=True)
    with pytest.raises(DataError, match="different lengths"):
        ds.map(lambda batch: {"a": [1], "b": [1, 2]}, batched=True)
    assert len(ds) == len(ROWS) and ds.column_names == ["text", "label"]
