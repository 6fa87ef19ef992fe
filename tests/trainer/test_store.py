"""Checkpoint store: atomic writes, verification, rotation that never loses the newest, fallback search."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinkle.checkpoint import CheckpointError
from twinkle.trainer import store


def _save(root: Path, step: int, payload: bytes = b"weights") -> Path:
    def save_model(tmp: Path) -> None:
        (tmp / store.MODEL_SUBDIR).mkdir()
        (tmp / store.MODEL_SUBDIR / "w.bin").write_bytes(payload)

    return store.write_checkpoint(root, step, save_model, {"step": step})


def test_write_verify_and_detect_damage(tmp_path: Path) -> None:
    path = _save(tmp_path, 3)
    assert path.name == "step-00000003" and store.verify(path) == {"step": 3}
    (path / "model" / "w.bin").write_bytes(b"short")
    with pytest.raises(CheckpointError, match="w.bin is 5 bytes, the manifest says 7"):
        store.verify(path)
    (path / "model" / "w.bin").unlink()
    with pytest.raises(CheckpointError, match="missing model/w.bin"):
        store.verify(path)


def test_a_failing_save_leaves_no_directory_under_the_final_name(tmp_path: Path) -> None:
    def broken(tmp: Path) -> None:
        (tmp / "partial").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        store.write_checkpoint(tmp_path, 1, broken, {"step": 1})
    assert list(tmp_path.iterdir()) == []


def test_rotation_keeps_the_newest_complete_and_leaves_damaged_ones(tmp_path: Path) -> None:
    for step in (1, 2, 3, 4):
        _save(tmp_path, step)
    damaged = _save(tmp_path, 5)
    (damaged / store.MANIFEST).unlink()  # the newest is damaged: it must not count as "newest complete"
    removed = store.rotate(tmp_path, 2)
    assert [p.name for p in removed] == ["step-00000001", "step-00000002"]
    assert [p.name for _, p in store.list_checkpoints(tmp_path)] == ["step-00000003", "step-00000004",
                                                                    "step-00000005"]
    assert store.rotate(tmp_path, 1) and store.complete_checkpoints(tmp_path)[-1][0] == 4
    assert store.rotate(tmp_path, -1) == []  # -1: keep everything


def test_clean_stale_removes_only_temporary_directories(tmp_path: Path) -> None:
    keep = _save(tmp_path, 1)
    for name in (".step-00000002.tmp-1-abc", ".step-00000001.old-1-abc", ".step-00000000.trash"):
        (tmp_path / name).mkdir()
    store.clean_stale(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [keep.name]


def test_rotation_never_deletes_the_checkpoint_just_written_nor_a_protected_one(tmp_path: Path) -> None:
    from twinkle.checkpoint import rotate

    paths = [_save(tmp_path, step) for step in (1, 2, 3, 4)]
    assert store.rotate(tmp_path, 1, written=paths[0]) == paths[1:3]  # the newest and the one just written stay
    assert [p.name for _, p in store.list_checkpoints(tmp_path)] == ["step-00000001", "step-00000004"]
    family = [*paths[:1], paths[3], tmp_path / "best"]
    (tmp_path / "best").mkdir()
    assert rotate(family, 1, protected={"best"}) == [paths[0]]  # "best" neither counts nor goes
    assert (tmp_path / "best").is_dir() and rotate(family[1:], 0) == []
