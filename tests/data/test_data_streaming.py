"""IterableDataset: local formats, seeking, on-the-fly map/encode, shuffle buffer, mixing, and the
DataLoader's rank/worker sharding with exact resume."""

from __future__ import annotations

import itertools
import json
import math

import pytest

from twinkle.dataloader import DataLoader
from twinkle.dataset import DataError, Dataset, DatasetMeta, IterableDataset
from twinkle.mesh import DeviceMesh

N = 50
ROWS = [{"i": i, "text": f"row number {i}"} for i in range(N)]


def write(path, rows, fmt):
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    table = pa.Table.from_pylist(rows)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "csv":
        pcsv.write_csv(table, str(path))
    elif fmt == "parquet":
        pq.write_table(table, str(path), row_group_size=7)  # several row groups: seeking skips whole ones
    elif fmt == "arrow":
        with pa.ipc.new_stream(str(path), table.schema) as w:  # the format datasets writes
            for batch in table.to_batches(max_chunksize=6):
                w.write_batch(batch)
    elif fmt == "txt":
        path.write_text("".join(r["text"] + "\n" for r in rows))
    elif fmt == "lance":
        import lance

        lance.write_dataset(table, str(path), max_rows_per_file=16, max_rows_per_group=8)
    return str(path)


FORMATS = ["jsonl", "json", "csv", "parquet", "arrow", "txt", "lance"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_streams_the_rows_of_its_file_and_seeks(tmp_path, fmt):
    if fmt == "lance":
        pytest.importorskip("lance", reason="the lance extra (pylance) is not installed")
    path = write(tmp_path / f"data.{fmt}", ROWS, fmt)
    expected = [{"text": r["text"]} for r in ROWS] if fmt == "txt" else ROWS
    stream = IterableDataset(DatasetMeta(path))
    assert list(stream) == expected
    assert next(stream) == expected[0] and next(stream) == expected[1]
    for start in (0, 6, 7, 20, N - 1, N):
        assert [row for _, row in stream.rows(start=start)] == expected[start:]
    assert stream.num_rows() == N
    if fmt not in ("txt", "lance"):
        assert list(stream) == list(Dataset(DatasetMeta(path)))  # what the eager Dataset reads
    with pytest.raises(TypeError, match="no length"):
        len(stream)


def test_directory_slices_and_bad_sources(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    write(folder / "a.parquet", ROWS[:20], "parquet")
    write(folder / "b.parquet", ROWS[20:], "parquet")
    stream = IterableDataset(DatasetMeta(str(folder), data_slice=range(5, 30)))
    assert [r["i"] for r in stream] == list(range(5, 30))
    assert [r["i"] for _, r in stream.rows(start=17)] == list(range(22, 30))
    with pytest.raises(DataError, match="contiguous range"):
        IterableDataset(DatasetMeta(str(folder), data_slice=[1, 3]))
    (folder / "c.jsonl").write_text("{}\n")
    with pytest.raises(DataError, match="mixes file types"):
        IterableDataset(DatasetMeta(str(folder)))
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match="empty.jsonl"):
        IterableDataset(DatasetMeta(str(tmp_path / "empty.jsonl")))


def messages(row):
    return {"messages": [{"role": "user", "content": row["text"]},
                         {"role": "assistant", "content": f"answer {row['i']}"}]}


def test_map_and_encode_on_the_fly_equal_the_eager_dataset(tmp_path, embedded_template):
    path = write(tmp_path / "d.jsonl", ROWS, "jsonl")
    eager = Dataset(DatasetMeta(path)).map(messages)
    eager.set_template(embedded_template)
    eager.encode()
    stream = IterableDataset(DatasetMeta(path)).map(messages)
    stream.set_template(embedded_template)
    stream.encode()
    assert list(stream) == list(eager)


def test_batched_map_and_filter_on_a_stream(tmp_path):
    path = write(tmp_path / "d.parquet", ROWS, "parquet")

    def double(batch):
        return {"i": [i for i in batch["i"] for _ in range(2)], "text": [t for t in batch["text"] for _ in range(2)]}

    stream = IterableDataset(DatasetMeta(path)).map(double, batched=True).filter(lambda r: r["i"] % 5 == 0)
    assert [r["i"] for r in stream] == [i for i in range(N) if i % 5 == 0 for _ in range(2)]
    upper = IterableDataset(DatasetMeta(path)).map(lambda b: {"text": [t.upper() for t in b["text"]]})
    assert [r["text"] for r in upper] == [r["text"].upper() for r in ROWS]  # read batched, as upstream's


def test_shuffle_buffer_is_a_seeded_permutation(tmp_path):
    path = write(tmp_path / "d.parquet", ROWS, "parquet")
    stream = IterableDataset(DatasetMeta(path))
    order = [r["i"] for _, r in stream.rows(shuffle_buffer=16, seed=3)]
    assert sorted(order) == list(range(N)) and order != list(range(N))
    assert order == [r["i"] for _, r in stream.rows(shuffle_buffer=16, seed=3)]
    assert order != [r["i"] for _, r in stream.rows(epoch=1, shuffle_buffer=16, seed=3)]
    assert [r["i"] for _, r in stream.rows(start=13, shuffle_buffer=16, seed=3)] == order[13:]


def test_weighted_mixing_follows_the_weights_and_seeks(tmp_path):
    big = [{"i": i, "text": "a"} for i in range(4000)]
    a = write(tmp_path / "a.parquet", big, "parquet")
    b = write(tmp_path / "b.jsonl", [{"i": -i - 1, "text": "b"} for i in range(4000)], "jsonl")
    stream = IterableDataset(DatasetMeta(a)).add_dataset(DatasetMeta(b))
    stream.mix_dataset(interleave=True, weights=[3, 1], seed=5)
    rows = [r for _, r in stream.rows()]
    n = len(rows)
    share = sum(r["text"] == "a" for r in rows) / n
    # first_exhausted ends when 'a' (drawn 3/4 of the time) runs out: ~5,333 rows; the share of 'a' is
    # binomial, so within 4 standard deviations of 0.75 unless the draws are wrong
    assert abs(share - 0.75) < 4 * math.sqrt(0.75 * 0.25 / n)
    assert sum(r["text"] == "a" for r in rows) == 4000 or sum(r["text"] == "b" for r in rows) == 4000
    # each source's rows come in their order, once
    assert [r["i"] for r in rows if r["text"] == "a"] == list(range(sum(r["text"] == "a" for r in rows)))
    for start in (0, 1, 4095, 4097, n - 3):
        assert [r for _, r in stream.rows(start=start)] == rows[start:]
    assert stream.num_rows() == n
    # all_exhausted: the short source restarts until both have been read once
    small = IterableDataset(DatasetMeta(data=[{"i": i, "text": "s"} for i in range(5)]))
    small.add_dataset(DatasetMeta(data=[{"i": i, "text": "t"} for i in range(12)]))
    small.mix_dataset(interleave=True, stopping_strategy="all_exhausted")
    both = [r for _, r in small.rows()]
    assert [r["i"] for r in both if r["text"] == "t"] == list(range(12))
    # round robin s, t, s, t ...: the stream ends at the draw that finds 't' done, after 13 draws of 's'
    assert [r["i"] for r in both if r["text"] == "s"] == [i % 5 for i in range(13)]
    for start in range(len(both) + 1):
        assert [r for _, r in small.rows(start=start)] == both[start:]


def batches_of(loader, n=None):
    return [[r["i"] for r in b] for b in itertools.islice(loader, n)]


@pytest.fixture
def corpus(tmp_path):
    return write(tmp_path / "corpus.jsonl", [{"i": i, "text": f"t{i}"} for i in range(103)], "jsonl")


def loader(path, rank=0, dp=1, workers=0, **kw):
    mesh = DeviceMesh.from_sizes(dp_size=dp) if dp > 1 else DeviceMesh()
    return DataLoader(IterableDataset(DatasetMeta(path)), batch_size=8, seed=1, shuffle_buffer=20, device_mesh=mesh,
                      rank=rank, num_workers=workers, **kw)


def test_stream_batches_ranks_and_resume_are_exact(corpus):
    whole = batches_of(loader(corpus))
    assert len(whole) == 103 // 8 and all(len(b) == 8 for b in whole)
    assert sorted(i for b in whole for i in b) == sorted(i for b in whole for i in b) and \
        len({i for b in whole for i in b}) == 12 * 8
    # two data-parallel ranks: each gets rows r::2 of every global batch, once
    ranks = [batches_of(loader(corpus, rank=r, dp=2)) for r in range(2)]
    for b, (x, y) in enumerate(zip(*ranks)):
        assert x == whole[b][0::2] and y == whole[b][1::2]
    # the loader is re-entered every step (as the Trainer does) and continues
    ld = loader(corpus)
    stepwise = [batches_of(ld, 1)[0] for _ in range(len(whole))]
    assert stepwise == whole
    # resume at every batch boundary, on each rank
    for stop in (1, 5, 11):
        for r, dp in ((0, 1), (1, 2)):
            first = loader(corpus, rank=r, dp=dp)
            head = batches_of(first, stop)
            resumed = loader(corpus, rank=r, dp=dp)
            resumed.resume_from_checkpoint(first.get_state()["consumed_train_samples"])
            assert head + batches_of(resumed) == (whole if dp == 1 else ranks[r])


def test_epochs_reshuffle_and_resume_into_a_later_epoch(corpus):
    ld = loader(corpus)
    epoch0, epoch1 = batches_of(ld), batches_of(ld)
    assert ld.epoch == 2 and ld.get_state()["consumed_train_samples"] == 2 * 96
    assert epoch0 != epoch1 and sorted(sum(epoch0, [])) != [] and len(epoch1) == 12
    resumed = loader(corpus)
    resumed.resume_from_checkpoint(96 + 3 * 8)
    assert resumed.epoch == 1
    assert batches_of(resumed) == epoch1[3:]
    with pytest.raises(DataError, match="batch boundary"):
        resumed.resume_from_checkpoint(5)
    assert resumed.get_state()["consumed_train_samples"] == 2 * 96  # unchanged


@pytest.mark.filterwarnings("ignore:lance is not fork-safe")  # an earlier test read lance; the workers do not
def test_two_workers_give_the_batches_of_none_and_resume(corpus):
    whole = batches_of(loader(corpus))
    with_workers = loader(corpus, workers=2)
    assert batches_of(with_workers) == whole
    head = loader(corpus, rank=1, dp=2, workers=2)
    first = batches_of(head, 3)
    resumed = loader(corpus, rank=1, dp=2, workers=2)
    resumed.resume_from_checkpoint(head.get_state()["consumed_train_samples"])
    assert first + batches_of(resumed) == [b[1::2] for b in whole]


def test_stream_loader_settings(corpus):
    with pytest.raises(TypeError, match="no length"):
        len(loader(corpus))
    with pytest.raises(DataError, match="num_workers must be"):
        loader(corpus, workers=-1)
    with pytest.raises(DataError, match="divide evenly"):
        DataLoader(IterableDataset(DatasetMeta(corpus)), batch_size=3, device_mesh=DeviceMesh.from_sizes(dp_size=2),
                   rank=0)
    with pytest.raises(DataError, match="num_workers applies to an IterableDataset"):
        DataLoader(Dataset(DatasetMeta(corpus)), batch_size=2, num_workers=2)
