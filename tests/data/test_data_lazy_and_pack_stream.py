"""LazyDataset (map + encode on access, cached), IterablePackingDataset (packs from a stream, exact resume)
and save_as round trips."""

from __future__ import annotations

import itertools
import json

import pytest

from twinkle.dataloader import DataLoader
from twinkle.dataset import DataError, Dataset, DatasetMeta, IterableDataset, IterablePackingDataset, LazyDataset
from twinkle.mesh import DeviceMesh
from twinkle.processor import InputProcessor

ROWS = [{"i": i, "text": " ".join(["word"] * (1 + (i * 7) % 23))} for i in range(60)]


def messages(row):
    return {"messages": [{"role": "user", "content": row["text"]},
                         {"role": "assistant", "content": f"answer {row['i']}"}]}


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def test_lazy_rows_equal_the_eager_rows_and_are_encoded_only_when_read(corpus, embedded_template):
    eager = Dataset(DatasetMeta(corpus)).map(messages)
    eager.set_template(embedded_template)
    eager.encode()
    calls = []

    def counted(row):
        calls.append(row["i"])
        return messages(row)

    lazy = LazyDataset(DatasetMeta(corpus)).map(counted, batched=False)
    lazy.set_template(embedded_template)
    lazy.encode()
    assert calls == [] and lazy.do_encode and len(lazy) == len(ROWS)
    assert lazy[5] == eager[5] and calls == [5]
    assert lazy[5] == eager[5] and calls == [5]  # cached
    assert lazy[[7, 5, -1]] == [eager[7], eager[5], eager[len(ROWS) - 1]]
    assert list(lazy) == list(eager)
    assert list(DataLoader(lazy, batch_size=8, seed=1)) == list(DataLoader(eager, batch_size=8, seed=1))
    with pytest.raises(IndexError):
        lazy[len(ROWS)]


def test_lazy_steps_that_drop_rows_name_the_row(corpus, embedded_template):
    lazy = LazyDataset(DatasetMeta(corpus)).map(messages)
    lazy.set_template("Template", max_length=12, truncation_strategy="delete")
    lazy.encode()
    with pytest.raises(DataError, match=r"encode\(Template\) turned rows .* LazyDataset needs one row per row"):
        list(lazy)
    with pytest.raises(DataError, match="strict=False"):
        LazyDataset(DatasetMeta(corpus)).map(messages, strict=False)
    kept = LazyDataset(DatasetMeta(corpus)).filter(lambda r: r["i"] % 2 == 0)  # eager, on the raw rows
    assert [r["i"] for r in kept] == list(range(0, 60, 2))


def test_lazy_per_source_maps(corpus):
    a, b = DatasetMeta(data=[{"x": 1}, {"x": 2}]), DatasetMeta(data=[{"x": 10}])
    lazy = LazyDataset(a).add_dataset(b)
    lazy.map(lambda r: {"y": r["x"] * 2}, dataset_meta=a, batched=False)
    lazy.map(lambda r: {"y": -r["x"]}, dataset_meta=b, batched=False)
    lazy.mix_dataset(interleave=False)
    assert list(lazy) == [{"x": 1, "y": 2}, {"x": 2, "y": 4}, {"x": 10, "y": -10}]


def packing_stream(corpus, template, **kw):
    stream = IterablePackingDataset(DatasetMeta(corpus), packing_interval=16, **kw).map(messages)
    stream.set_template("Template", max_length=96)
    stream.pack_dataset()
    return stream


def test_pack_stream_holds_every_row_once_within_the_budget(corpus, embedded_template):
    eager = Dataset(DatasetMeta(corpus)).map(messages)
    eager.set_template("Template", max_length=96)
    eager.encode()
    stream = packing_stream(corpus, embedded_template)
    packs = list(stream)
    seen = []
    for pack in packs:
        assert len(pack["input_ids"]) == pack["length"] <= 96
        starts = [k for k, p in enumerate(pack["position_ids"]) if p == 0]
        seen += [tuple(pack["input_ids"][s:e]) for s, e in zip(starts, starts[1:] + [pack["length"]])]
    assert sorted(seen) == sorted(tuple(r["input_ids"]) for r in eager)
    report = stream.pack_report
    assert report.rows == len(ROWS) and report.packs == len(packs) < len(ROWS)
    assert stream.num_rows() == len(packs)
    cyclic = packing_stream(corpus, embedded_template, cyclic=True)
    more = list(itertools.islice(cyclic, 2 * len(packs)))
    assert more[:len(packs)] == packs and len(more) == 2 * len(packs)


def test_resume_inside_a_pack_stream_is_exact(corpus, embedded_template):
    def loader(rank=0, dp=1, processor=True):
        mesh = DeviceMesh.from_sizes(dp_size=dp) if dp > 1 else DeviceMesh()
        return DataLoader(packing_stream(corpus, embedded_template), batch_size=2, shuffle_buffer=8, seed=4,
                          device_mesh=mesh, rank=rank,
                          processor=InputProcessor(padding_free=True) if processor else None)

    def as_lists(batches):
        return [{k: v.tolist() for k, v in b.items()} for b in batches]

    whole = as_lists(loader())
    assert len(whole) >= 4
    for stop in (1, 3):
        head = loader()
        first = as_lists(itertools.islice(head, stop))
        resumed = loader()
        resumed.resume_from_checkpoint(head.get_state()["consumed_train_samples"])
        assert first + as_lists(resumed) == whole  # token for token: integer data, exact
    # two ranks: rank r gets pack r of every global batch of two packs, also after a resume
    packs = list(loader(processor=False))
    for r in range(2):
        assert list(loader(r, 2, processor=False)) == [[b[r]] for b in packs]
        head = loader(r, 2, processor=False)
        first = list(itertools.islice(head, 2))
        resumed = loader(r, 2, processor=False)
        resumed.resume_from_checkpoint(head.get_state()["consumed_train_samples"])
        assert first + list(resumed) == [[b[r]] for b in packs]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_save_as_round_trips(tmp_path, corpus, embedded_template, suffix):
    raw = Dataset(DatasetMeta(corpus))
    path = raw.save_as(str(tmp_path / f"raw{suffix}"))
    assert list(Dataset(DatasetMeta(path))) == list(raw)
    stream = IterableDataset(DatasetMeta(corpus))
    assert list(Dataset(DatasetMeta(stream.save_as(str(tmp_path / f"s{suffix}"), batch_size=7)))) == list(raw)
    encoded = Dataset(DatasetMeta(corpus)).map(messages)
    encoded.set_template(embedded_template)
    encoded.encode()
    if suffix == ".csv":
        with pytest.raises(DataError, match="CSV cannot hold the nested columns"):
            encoded.save_as(str(tmp_path / "enc.csv"))
        assert not (tmp_path / "enc.csv").exists() and not (tmp_path / "enc.csv.tmp").exists()
        return
    back = Dataset(DatasetMeta(encoded.save_as(str(tmp_path / f"enc{suffix}"))))
    assert list(back) == list(encoded)
    lazy = LazyDataset(DatasetMeta(corpus)).map(messages)
    lazy.set_template(embedded_template)
    lazy.encode()
    assert list(Dataset(DatasetMeta(lazy.save_as(str(tmp_path / f"lazy{suffix}"))))) == list(encoded)
    with pytest.raises(DataError, match="cannot tell the format"):
        raw.save_as(str(tmp_path / "out.bin"))
