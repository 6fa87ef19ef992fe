"""DataLoader: DP slices over simulated ranks, deterministic epochs, exact resume, and bad settings."""

from __future__ import annotations

import itertools

import pytest

import twinkle.runtime
from twinkle.dataloader import DataLoader
from twinkle.dataset import DataError, Dataset, DatasetMeta, IterableDataset
from twinkle.mesh import DeviceMesh
from twinkle.processor import InputProcessor

N = 23


@pytest.fixture(scope="module")
def dataset() -> Dataset:
    return Dataset(DatasetMeta(data=[{"i": i, "input_ids": [i + 1] * (1 + i % 4)} for i in range(N)]))


def ids(batch) -> list[int]:
    return [row["i"] for row in batch]


def run(loader: DataLoader, batches: int | None = None) -> list[list[int]]:
    return [ids(b) for b in itertools.islice(loader, batches)]


def test_dp_slices_partition_the_global_batch(dataset):
    single = run(DataLoader(dataset, batch_size=6, seed=3, device_mesh=DeviceMesh()))
    mesh = DeviceMesh.from_sizes(dp_size=2)
    rank0 = run(DataLoader(dataset, batch_size=6, seed=3, device_mesh=mesh, rank=0))
    rank1 = run(DataLoader(dataset, batch_size=6, seed=3, device_mesh=mesh, rank=1))
    assert len(single) == len(rank0) == len(rank1) == N // 6
    for whole, a, b in zip(single, rank0, rank1):
        assert len(a) == len(b) == 3 and not set(a) & set(b)
        assert sorted(a + b) == sorted(whole)
        assert a == whole[0::2] and b == whole[1::2]


def test_ranks_that_differ_only_in_tp_read_the_same_slice(dataset):
    mesh = DeviceMesh.from_sizes(dp_size=1, fsdp_size=2, tp_size=2)  # ranks 0,1: fsdp 0; ranks 2,3: fsdp 1
    slices = [run(DataLoader(dataset, batch_size=4, device_mesh=mesh, rank=r)) for r in range(4)]
    assert slices[0] == slices[1] and slices[2] == slices[3] and slices[0] != slices[2]
    assert all(not set(a) & set(b) for a, b in zip(slices[0], slices[2]))


def test_rank_and_mesh_come_from_the_runtime(dataset, monkeypatch):
    mesh = DeviceMesh.from_sizes(dp_size=2)
    monkeypatch.setattr(twinkle.runtime, "_runtime", twinkle.runtime.Runtime(rank=1, world_size=2, device_mesh=mesh,
                                                                              seed=11))
    loader = DataLoader(dataset, batch_size=4)
    explicit = DataLoader(dataset, batch_size=4, seed=11, device_mesh=mesh, rank=1)
    assert loader.data_rank == 1 and run(loader) == run(explicit)


def test_epochs_are_deterministic_permutations(dataset):
    loader = DataLoader(dataset, batch_size=5, seed=1)
    epoch0, epoch1 = run(loader), run(loader)
    again = DataLoader(dataset, batch_size=5, seed=1)
    assert run(again) == epoch0 and run(again) == epoch1
    assert epoch0 != epoch1 and epoch0 != run(DataLoader(dataset, batch_size=5, seed=2))
    flat = [i for b in epoch0 for i in b]
    assert len(set(flat)) == len(flat) == 20
    assert run(DataLoader(dataset, batch_size=5, shuffle=False)) == [list(range(k, k + 5)) for k in range(0, 20, 5)]


def test_last_partial_batch_and_len(dataset):
    assert len(DataLoader(dataset, batch_size=5)) == 4  # default drops the 3-row remainder
    loader = DataLoader(dataset, batch_size=5, min_batch_size=3, shuffle=False)
    assert len(loader) == 5 and run(loader)[-1] == [20, 21, 22]
    assert loader.get_state() == {"consumed_train_samples": 23}
    mesh = DeviceMesh.from_sizes(dp_size=2)  # 3 leftover rows over 2 ranks: cut to 2, one each
    tails = [run(DataLoader(dataset, batch_size=4, min_batch_size=2, shuffle=False, device_mesh=mesh, rank=r))[-1]
             for r in range(2)]
    assert tails == [[20], [21]]
    assert len(DataLoader(dataset, batch_size=4, min_batch_size=4, device_mesh=mesh, rank=0)) == 5


@pytest.mark.parametrize("stop", [1, 3, 4, 6, 9])
def test_resume_continues_exactly_like_an_uninterrupted_run(dataset, stop):
    """Epoch = 3 batches of 6 + a tail cut to 4 rows (22 samples); stops inside, at and past epoch ends."""
    mesh = DeviceMesh.from_sizes(dp_size=2)
    for rank in range(2):
        reference = DataLoader(dataset, batch_size=6, min_batch_size=2, seed=5, device_mesh=mesh, rank=rank)
        uninterrupted = run(reference) + run(reference) + run(reference)
        first = DataLoader(dataset, batch_size=6, min_batch_size=2, seed=5, device_mesh=mesh, rank=rank)
        seen = []
        while len(seen) < stop:
            seen += run(first, stop - len(seen))
        state = first.get_state()
        resumed = DataLoader(dataset, batch_size=6, min_batch_size=2, seed=5, device_mesh=mesh, rank=rank)
        resumed.resume_from_checkpoint(state["consumed_train_samples"])
        rest = []
        while len(seen) + len(rest) < len(uninterrupted):
            rest += run(resumed)
        assert seen + rest == uninterrupted
        assert resumed.get_state() == reference.get_state()


def test_bad_resume_values_leave_the_state(dataset):
    loader = DataLoader(dataset, batch_size=5)
    run(loader, 2)
    with pytest.raises(DataError, match=r"consumed_train_samples=7 does not fall on a batch boundary"):
        loader.resume_from_checkpoint(7)
    with pytest.raises(DataError, match=r"non-negative integer, got -5"):
        loader.resume_from_checkpoint(-5)
    assert loader.get_state() == {"consumed_train_samples": 10}


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"batch_size": 5, "device_mesh": DeviceMesh.from_sizes(dp_size=2)}, r"batch_size=5 is global.*2 data-parallel"),
    ({"batch_size": 0}, r"batch_size must be a positive integer"),
    ({"batch_size": 30}, r"23 rows: not one batch of batch_size=30"),
    ({"batch_size": 4, "min_batch_size": 9}, r"min_batch_size must be between 1 and batch_size=4"),
    ({"batch_size": 4, "seed": -1}, r"seed must be a non-negative integer, got -1"),
])
def test_bad_settings(dataset, kwargs, message):
    with pytest.raises(DataError, match=message):
        DataLoader(dataset, **kwargs)


def test_processor_by_name_class_or_instance(dataset):
    rows = run(DataLoader(dataset, batch_size=4, seed=9), 1)[0]
    for processor in ("InputProcessor", InputProcessor, InputProcessor(pad_token_id=0)):
        batch = next(iter(DataLoader(dataset, batch_size=4, seed=9, processor=processor)))
        assert batch["input_ids"].shape[0] == 4
        assert [row[0] - 1 for row in batch["input_ids"].tolist()] == rows
    loader = DataLoader(dataset, batch_size=4)
    loader.set_processor("InputProcessor", padding_free=True)
    assert next(iter(loader))["input_ids"].shape[0] == 1


@pytest.mark.slow
def test_torchrun_two_ranks_split_the_seed_flow(tmp_path):
    """Two real gloo processes each build the dataset; their slices interleave into the global batches."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from twinkle.preprocessor import SelfCognitionProcessor

    script = Path(__file__).parent / "scripts" / "torchrun_loader.py"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    reference = Dataset(DatasetMeta("twinkle://self-cognition", data_slice=range(40)))
    reference.set_template("Qwen3_5Template", max_length=128)
    reference.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区")).encode()
    single = [[row["input_ids"] for row in batch]
              for batch in DataLoader(reference, batch_size=8, seed=7, device_mesh=DeviceMesh())]
    assert [r["data_rank"] for r in ranks] == [0, 1] and [r["len"] for r in ranks] == [5, 5]
    assert all(r["state"] == {"consumed_train_samples": 40} for r in ranks)
    for b, whole in enumerate(single):
        a, c = ranks[0]["batches"][b], ranks[1]["batches"][b]
        assert a == whole[0::2] and c == whole[1::2]
    # the streamed rows: 2 ranks x 2 workers, resumed after 2 batches, give the one-process stream's batches
    stream = IterableDataset(DatasetMeta("twinkle://self-cognition", data_slice=range(40)))
    stream.set_template("Qwen3_5Template", max_length=128)
    stream.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区")).encode()
    streamed = [[row["input_ids"] for row in batch]
                for batch in DataLoader(stream, batch_size=8, seed=7, shuffle_buffer=16, device_mesh=DeviceMesh())]
    assert len(streamed) == 5 and all(r["stream_state"] == {"consumed_train_samples": 40, "stream_position": [1, 0, 0]}
                                      for r in ranks)  # the next row: the start of the second epoch
    assert sorted(map(tuple, sum(streamed, []))) == sorted(map(tuple, sum(single, [])))  # the same rows
    for b, whole in enumerate(streamed):
        assert ranks[0]["stream_batches"][b] == whole[0::2] and ranks[1]["stream_batches"][b] == whole[1::2]


def test_the_epoch_order_is_drawn_once_per_epoch_when_the_loader_is_reentered(dataset, monkeypatch):
    """The Trainer takes one batch per ``for`` and re-enters the loader each step: that must not re-permute."""
    import numpy as np

    draws = []
    real = np.random.default_rng

    def counting(seed=None):
        draws.append(seed)
        return real(seed)

    monkeypatch.setattr(np.random, "default_rng", counting)
    steps = 2 * (N // 2) + 3  # two whole epochs of batch_size=2 and the start of a third
    loader = DataLoader(dataset, batch_size=2, seed=4)
    reentered = []
    for _ in range(steps):
        for batch in loader:  # one batch per entry, as the Trainer does
            reentered.append(ids(batch))
            break
    assert draws == [[4, 0], [4, 1], [4, 2]]  # one permutation per epoch, not one per step
    monkeypatch.setattr(np.random, "default_rng", real)
    uninterrupted = DataLoader(dataset, batch_size=2, seed=4)
    expected = run(uninterrupted) + run(uninterrupted) + run(uninterrupted)
    assert reentered == expected[:steps] and len(reentered) == steps
