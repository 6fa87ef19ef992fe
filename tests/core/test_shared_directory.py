"""shared_atomic_directory on one process: atomic_directory, then ``finish`` (2 ranks: test_collective_placement);
its split form (shared_temporary / shared_commit) behind a PendingSave, whose writes finish later."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

import pytest

from twinkle.checkpoint import PendingSave, shared_atomic_directory, shared_commit, shared_temporary


def _listing(tmp: Path) -> None:
    (tmp / "manifest").write_text(",".join(sorted(p.name for p in tmp.iterdir())))


def test_finish_sees_the_written_files_before_the_rename(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    with shared_atomic_directory(final, finish=_listing) as tmp:
        (tmp / "weights").write_text("w")
        assert not final.exists()
    assert (final / "manifest").read_text() == "weights"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_a_failing_body_or_finish_leaves_the_previous_directory(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    final.mkdir()
    (final / "old").write_text("kept")
    calls = []
    with pytest.raises(OSError, match="disk full"):
        with shared_atomic_directory(final, finish=calls.append) as tmp:
            (tmp / "weights").write_text("w")
            raise OSError("disk full")
    assert calls == []  # finish never runs after a failed body

    def broken(tmp: Path) -> None:
        raise ValueError("manifest failed")

    with pytest.raises(ValueError, match="manifest failed"):
        with shared_atomic_directory(final, finish=broken) as tmp:
            (tmp / "weights").write_text("w")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    assert [p.name for p in final.iterdir()] == ["old"]


def _pending(final: Path, future: Future, finish=None) -> tuple[PendingSave, Path]:
    tmp = shared_temporary(final)
    (tmp / "weights").write_text("w")
    return PendingSave(str(final), [future], lambda ok: shared_commit(tmp, final, ok, finish)), tmp


def test_a_pending_save_appears_under_its_name_only_when_its_writes_finished(tmp_path: Path) -> None:
    final, future = tmp_path / "ckpt", Future()
    pending, tmp = _pending(final, future, finish=_listing)
    assert not pending.done() and not final.exists() and tmp.is_dir()
    future.set_result(None)
    assert pending.done() and pending.wait() == str(final)
    assert (final / "manifest").read_text() == "weights" and not tmp.exists()
    assert pending.wait() == str(final)  # once: a second wait changes nothing


def test_a_failed_background_write_raises_in_wait_and_leaves_the_previous_directory(tmp_path: Path) -> None:
    final, future = tmp_path / "ckpt", Future()
    final.mkdir()
    (final / "old").write_text("kept")
    calls: list[Path] = []
    pending, tmp = _pending(final, future, finish=calls.append)
    future.set_exception(OSError("disk full"))
    with pytest.raises(OSError, match="disk full"):
        pending.wait()
    assert calls == [] and not tmp.exists()  # the temporary directory is gone, finish never ran
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"] and [p.name for p in final.iterdir()] == ["old"]


def test_each_rank_checksums_its_share_of_the_files_for_the_manifest(tmp_path: Path, monkeypatch) -> None:
    """Rank 0 of 2 reads only its half of a sharded save's bytes for the manifest; rank 1's checksums (computed
    here as rank 1 would) come through the gather, and the manifest equals one process's of the same files."""
    import shutil

    from twinkle import collective
    from twinkle.checkpoint import manifest

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for i in range(4):
        (tmp / f"shard-{i}.bin").write_bytes(bytes([i]) * (1000 + i))
    reference = tmp_path / "reference"
    shutil.copytree(tmp, reference)
    manifest.write_manifest(reference, step=1)
    rank_1 = manifest.shared_checksums(tmp, (1, 2))
    monkeypatch.setattr(collective, "world_size", lambda group=None: 2)
    monkeypatch.setattr(collective, "rank", lambda group=None: 0)
    monkeypatch.setattr(collective, "failed_ranks", lambda ok, group=None: [])
    monkeypatch.setattr(collective, "gather_object", lambda obj, dst=0, group=None: [obj, rank_1])
    monkeypatch.setattr(collective, "broadcast_object", lambda obj, src=0, group=None: obj)
    reads = []
    real = manifest.file_checksum
    monkeypatch.setattr(manifest, "file_checksum", lambda path: reads.append(Path(path).name) or real(path))
    final = tmp_path / "ckpt"
    shared_commit(tmp, final, True, finish=lambda d: manifest.write_manifest(d, step=1))
    assert sorted(reads) == ["shard-0.bin", "shard-2.bin"]
    assert (final / manifest.MANIFEST_FILE).read_text() == (reference / manifest.MANIFEST_FILE).read_text()
    manifest.verify_manifest(final)
