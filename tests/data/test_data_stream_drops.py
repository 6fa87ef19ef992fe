"""A stream whose steps drop rows (a filter, a row too long for max_length) still gives full batches, the next rows
filling in; resume stays exact (from the saved position or from the sample count alone), across epochs too; and
DataLoader workers started with spawn give the batches of none."""

from __future__ import annotations

import itertools
import json

import pytest

from twinkle.dataloader import DataLoader
from twinkle.dataset import DataError, Dataset, DatasetMeta, IterableDataset
from twinkle.mesh import DeviceMesh

N, B = 90, 8


def keep(row):
    """Drops every row whose i is 3 mod 7 (module level: spawn workers unpickle it by name)."""
    return row["i"] % 7 != 3


def messages(row):
    return {"messages": [{"role": "user", "content": row["text"]},
                         {"role": "assistant", "content": f"answer {row['i']}"}]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    # every 5th row is far longer than max_length: encode drops it (truncation_strategy='delete')
    rows = [{"i": i, "text": " ".join(["word"] * (200 if i % 5 == 0 else 1 + i % 4))} for i in range(N)]
    path = tmp_path_factory.mktemp("drops") / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


_TEMPLATE = []


def template():
    """One Template (its tokenizer loaded once) for every pipeline of this module."""
    if not _TEMPLATE:
        from twinkle.template import Template

        _TEMPLATE.append(Template(max_length=48, truncation_strategy="delete"))
    return _TEMPLATE[0]


def pipeline(kind, path):
    data = kind(DatasetMeta(path)).filter(keep).map(messages, batched=False)
    data.set_template(template())
    data.encode()
    return data


def loader(path, rank=0, dp=1, workers=0, shuffle=True, **kw):
    mesh = DeviceMesh.from_sizes(dp_size=dp) if dp > 1 else DeviceMesh()
    return DataLoader(pipeline(IterableDataset, path), batch_size=B, seed=2, shuffle=shuffle, shuffle_buffer=16,
                      device_mesh=mesh, rank=rank, num_workers=workers, **kw)


def ids(batches):
    return [[tuple(r["input_ids"]) for r in b] for b in batches]


def test_dropped_rows_are_replaced_and_batches_stay_full(corpus):
    survivors = [tuple(r["input_ids"]) for r in pipeline(Dataset, corpus)]  # the eager Dataset's rows
    dropped = N - len(survivors)
    assert dropped >= 25  # 13 filtered, 18 too long, some both
    whole = ids(loader(corpus, shuffle=False))
    assert all(len(b) == B for b in whole) and len(whole) == len(survivors) // B
    assert sum(whole, []) == survivors[:len(whole) * B]  # the next rows fill in, in stream order
    for r in range(2):
        assert ids(loader(corpus, rank=r, dp=2, shuffle=False)) == [b[r::2] for b in whole]
    shuffled = ids(loader(corpus))
    assert all(len(b) == B for b in shuffled) and set(sum(shuffled, [])) <= set(survivors)
    assert sum(shuffled, []) != sum(whole, [])
    # re-entered for every batch (as the Trainer does): the same batches, then an empty end of the epoch
    ld = loader(corpus)
    stepwise = [ids(itertools.islice(ld, 1)) for _ in range(len(shuffled) + 2)]
    assert sum(stepwise[:len(shuffled)], []) == shuffled and stepwise[len(shuffled)] == []
    assert len(stepwise[-1]) == 1 and ld.epoch == 1  # the next epoch's first batch


def test_resume_is_exact_from_the_position_or_the_count(corpus, twinkle_log):
    whole = ids(loader(corpus))
    for stop in (1, 3, len(whole) - 1):
        head = loader(corpus)
        first = ids(itertools.islice(head, stop))
        state = head.get_state()
        assert state["consumed_train_samples"] == stop * B
        resumed = loader(corpus)
        resumed.resume_from_checkpoint(**state)
        assert first + ids(resumed) == whole
        by_count = loader(corpus, rank=1, dp=2)
        by_count.resume_from_checkpoint(state["consumed_train_samples"])  # re-reads the stream up to there
        assert ids(by_count) == [b[1::2] for b in whole[stop:]]
    assert "from a sample count alone" in twinkle_log.text
    with pytest.raises(DataError, match="does not fall on a batch boundary"):
        loader(corpus).resume_from_checkpoint(5)
    with pytest.raises(DataError, match=r"stream_position must be \[epoch, chunk, offset\]"):
        loader(corpus).resume_from_checkpoint(8, stream_position=[0, -1, 0])


def test_epochs_reshuffle_and_resume_across_the_boundary(corpus):
    ld = loader(corpus)
    epoch0, epoch1 = ids(ld), ids(ld)
    per_epoch = len(epoch0)
    assert len(epoch1) == per_epoch and epoch0 != epoch1  # the buffer reshuffles per epoch (the last rows differ)
    assert len(set(sum(epoch0, [])) & set(sum(epoch1, []))) >= per_epoch * B - B
    assert ld.epoch == 2 and ld.stream.batches_per_epoch() == per_epoch
    for consumed, expected in ((per_epoch * B, epoch1), ((per_epoch + 2) * B, epoch1[2:])):
        head = loader(corpus)
        list(head)
        for _ in itertools.islice(head, consumed // B - per_epoch):
            pass
        state = head.get_state()
        assert state["consumed_train_samples"] == consumed
        for kwargs in (state, {"consumed_train_samples": consumed}):
            resumed = loader(corpus)
            resumed.resume_from_checkpoint(**kwargs)
            assert resumed.epoch == 1 and ids(resumed) == expected


def test_spawn_workers_give_the_batches_of_none(corpus):
    whole = ids(loader(corpus))
    head = loader(corpus)
    first = ids(itertools.islice(head, 2))
    # two spawned workers (each unpickles the dataset: functions by name, the template with its tokenizer)
    resumed = loader(corpus, workers=2, multiprocessing_context="spawn")
    resumed.resume_from_checkpoint(**head.get_state())
    assert first + ids(resumed) == whole
    unpicklable = IterableDataset(DatasetMeta(corpus)).filter(lambda r: r["i"] > 2)
    spawned = DataLoader(unpicklable, batch_size=B, num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(DataError, match=r"'spawn' start method .* cannot be pickled .* defined at module level"):
        next(iter(spawned))
    with pytest.raises(DataError, match="multiprocessing_context must be"):
        DataLoader(unpicklable, batch_size=B, multiprocessing_context="thread")
