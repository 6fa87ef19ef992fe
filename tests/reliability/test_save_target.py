"""Issue 13 item 2 (save never deletes a user's directory) and the unsafe-save-name weak case (NUL)."""

from __future__ import annotations

import pytest
from hostile_testing import lora_model

from twinkle.checkpoint import CheckpointError


@pytest.fixture(scope="module")
def model():
    return lora_model()


def test_save_over_a_user_directory_is_refused_and_deletes_nothing(model, tmp_path) -> None:
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('my work')\n")
    (project / "notes.md").write_text("do not lose me\n")
    with pytest.raises(CheckpointError, match=r"Refusing to replace .*project.*not a twinkle checkpoint.*"
                                              r"notes\.md.*overwrite=True"):
        model.save("project", output_dir=str(tmp_path), save_optimizer=True)
    assert (project / "src" / "main.py").read_text() == "print('my work')\n"
    assert (project / "notes.md").read_text() == "do not lose me\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]  # no temporary directory left either


def test_a_file_of_that_name_is_refused_too(model, tmp_path) -> None:
    (tmp_path / "ckpt").write_text("a file\n")
    with pytest.raises(CheckpointError, match="it is a file"):
        model.save("ckpt", output_dir=str(tmp_path))
    assert (tmp_path / "ckpt").read_text() == "a file\n"


def test_checkpoints_and_empty_directories_are_replaced_and_overwrite_allows_anything(model, tmp_path) -> None:
    first = model.save("ck", output_dir=str(tmp_path))
    assert model.save("ck", output_dir=str(tmp_path), save_optimizer=True) == first  # a twinkle checkpoint
    (tmp_path / "empty").mkdir()
    model.save("empty", output_dir=str(tmp_path))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.txt").write_text("x")
    model.save("other", output_dir=str(tmp_path), overwrite=True)
    assert not (tmp_path / "other" / "x.txt").exists() and (tmp_path / "other" / "trainer_state.json").is_file()


@pytest.mark.parametrize("name", ["bad\x00name", "line\nbreak", "tab\tname"])
def test_control_characters_in_save_names_are_refused_clearly(model, tmp_path, name) -> None:
    with pytest.raises(CheckpointError, match=r"control character .*plain name"):
        model.save(name, output_dir=str(tmp_path))
    assert list(tmp_path.iterdir()) == []
