"""Hub datasets stream through ``datasets.load_dataset(..., streaming=True)``, never downloaded whole first: a local
dataset repository (the layout of a hub snapshot: a README.md card naming subsets and splits) goes through that
same call, and hf:// / ms:// ids reach it (or ModelScope's streaming load) with their subset and split."""

from __future__ import annotations

import sys
import types

import pytest

from twinkle.dataloader import DataLoader
from twinkle.dataset import DataError, Dataset, DatasetMeta, IterableDataset

CARD = """---
configs:
- config_name: default
  data_files:
  - split: train
    path: data/train-*.parquet
  - split: test
    path: data/test.parquet
- config_name: extra
  data_files:
  - split: train
    path: extra/rows.parquet
---
# a dataset card
"""
TRAIN = [{"i": i, "text": f"train {i}"} for i in range(30)]
TEST = [{"i": -i, "text": f"test {i}"} for i in range(12)]
EXTRA = [{"i": 100 + i, "text": f"extra {i}"} for i in range(7)]


@pytest.fixture
def repo(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path / "repo"
    (root / "data").mkdir(parents=True)
    (root / "extra").mkdir()
    (root / "README.md").write_text(CARD)
    pq.write_table(pa.Table.from_pylist(TRAIN[:20]), str(root / "data" / "train-00000.parquet"), row_group_size=8)
    pq.write_table(pa.Table.from_pylist(TRAIN[20:]), str(root / "data" / "train-00001.parquet"))
    pq.write_table(pa.Table.from_pylist(TEST), str(root / "data" / "test.parquet"))
    pq.write_table(pa.Table.from_pylist(EXTRA), str(root / "extra" / "rows.parquet"))
    return str(root)


def test_a_local_dataset_repository_streams_its_subsets_and_splits(repo):
    for meta, rows in ((DatasetMeta(repo), TRAIN), (DatasetMeta(repo, split="test"), TEST),
                       (DatasetMeta(repo, subset_name="extra"), EXTRA)):
        stream = IterableDataset(meta)
        assert list(stream) == rows  # the split's files only, as the card says
        assert list(stream) == list(Dataset(meta))  # what the eager Dataset reads through load_dataset
        for start in (0, 5, len(rows) - 1, len(rows)):
            assert [r for _, r in stream.rows(start=start)] == rows[start:]
        assert stream.num_rows() == len(rows)
    head = DataLoader(IterableDataset(DatasetMeta(repo)), batch_size=4, seed=3, shuffle_buffer=8)
    whole = [[r["i"] for r in b] for b in head]
    first = DataLoader(IterableDataset(DatasetMeta(repo)), batch_size=4, seed=3, shuffle_buffer=8)
    part = [[r["i"] for r in b] for _, b in zip(range(3), first)]
    resumed = DataLoader(IterableDataset(DatasetMeta(repo)), batch_size=4, seed=3, shuffle_buffer=8)
    resumed.resume_from_checkpoint(first.get_state()["consumed_train_samples"])
    assert part + [[r["i"] for r in b] for b in resumed] == whole and len(whole) == 7
    with pytest.raises(DataError, match=r"Could not stream .* \(subset 'nope', split 'train'\)"):
        IterableDataset(DatasetMeta(repo, subset_name="nope"))


def test_hub_ids_stream_through_load_dataset_without_a_snapshot(repo, monkeypatch):
    import datasets
    import huggingface_hub

    real = datasets.load_dataset
    calls = []

    def load_dataset(path, *args, **kwargs):
        calls.append((path, kwargs.get("name"), kwargs.get("split"), kwargs.get("streaming")))
        return real(repo if path == "org/rows" else path, *args, **kwargs)  # the hub repo, laid out locally

    def no_snapshot(*args, **kwargs):
        raise AssertionError("a streamed dataset must not be downloaded whole")

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_snapshot)
    stream = IterableDataset(DatasetMeta("hf://org/rows", split="test"))
    assert list(stream) == TEST and [r for _, r in stream.rows(start=4)] == TEST[4:]
    assert calls and all(c == ("org/rows", None, "test", True) for c in calls)
    # ModelScope: its streaming load (for its general datasets an HF IterableDataset from the same call)
    ms_calls = []

    def ms_load(repo_id, **kwargs):
        ms_calls.append((repo_id, kwargs))
        return real(repo, name=kwargs["subset_name"], split=kwargs["split"], streaming=True)

    monkeypatch.setitem(sys.modules, "modelscope", types.SimpleNamespace(MsDataset=types.SimpleNamespace(
        load=ms_load), snapshot_download=no_snapshot))
    assert list(IterableDataset(DatasetMeta("ms://org/rows", subset_name="extra"))) == EXTRA
    assert ms_calls[0] == ("org/rows", {"subset_name": "extra", "split": "train", "use_streaming": True})
    monkeypatch.setitem(sys.modules, "modelscope", None)
    with pytest.raises(DataError, match=r"ModelScope client: pip install 'twinkle-core\[modelscope\]'"):
        IterableDataset(DatasetMeta("ms://org/rows"))
