"""shared_atomic_directory on one process: atomic_directory, then ``finish`` (2 ranks: test_collective_placement)."""

from __future__ import annotations

from pathlib import Path

import pytest

from twinkle.checkpoint import shared_atomic_directory


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
