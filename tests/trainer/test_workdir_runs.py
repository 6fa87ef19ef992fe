"""A work_dir never loses a better result: a second run refuses (naming the first and the options), continues
it (auto_resume) or replaces it (overwrite); the printed checkpoint exists; best-checkpoint only improves within
its run; the jsonl tracker appends per run; `twinkle plot` draws the newest run's curves."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_testing import cli_env, tiny_job, write_config

from twinkle.trainer import Trainer, store
from twinkle.trainer.trackers import read_records
from twinkle.trainer.workdir import WorkDirInUseError

EVAL = {"train_samples": 16, "eval_samples": 4, "max_length": 128}


def _digest(directory: Path) -> str:
    sha = hashlib.sha256()
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        sha.update(path.name.encode() + path.read_bytes())
    return sha.hexdigest()


def _results(wd: Path) -> dict[str, str]:
    return {str(p.relative_to(wd)): _digest(p) for p in [*(wd / "checkpoints").iterdir(), wd / "best-checkpoint"]}


def test_a_second_run_refuses_continues_or_replaces_and_never_loses_a_better_result(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    first = Trainer(**tiny_job(wd, total_step=4, checkpoint_interval=2, checkpoint_maxkeep=2, eval_interval=2,
                               dataset=EVAL)).fit()
    before = _results(wd)
    best = json.loads((wd / "best-checkpoint.json").read_text())
    assert best["run_id"] == first.run_id and best["eval_loss"] == first.best_eval_loss

    # a new run in the same work_dir (what used to rotate the old checkpoints out and replace the best) is refused
    with pytest.raises(WorkDirInUseError) as refused:
        Trainer(**tiny_job(wd, total_step=1, checkpoint_interval=2, checkpoint_maxkeep=2, eval_interval=1,
                           dataset=EVAL)).fit()
    message = str(refused.value)
    assert f"run {first.run_id}" in message and "step-00000004" in message
    assert f"best eval loss {first.best_eval_loss:.4f}" in message
    assert "--auto-resume" in message and "--work-dir" in message and "--overwrite" in message
    assert _results(wd) == before  # nothing touched

    # the CLI says the same in one line and exits 2, before loading anything
    config = write_config(tmp_path / "job.yaml", tiny_job(wd, total_step=1, dataset=EVAL))
    proc = subprocess.run([sys.executable, "-m", "twinkle.cli.main", "train", str(config)], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 2 and f"twinkle train: error: work_dir {str(wd)!r} holds the results of run " \
        f"{first.run_id}" in proc.stderr
    assert _results(wd) == before

    # continuing it: the same run; best-checkpoint is replaced only by a better evaluation of this run
    resumed = Trainer(**tiny_job(wd, total_step=6, checkpoint_interval=2, checkpoint_maxkeep=2, eval_interval=2,
                                 dataset=EVAL, auto_resume=True)).fit()
    assert resumed.run_id == first.run_id and resumed.resumed_from.endswith("step-00000004")
    assert Path(resumed.checkpoint).is_dir() and resumed.checkpoint.endswith("step-00000006")
    record = json.loads((wd / "best-checkpoint.json").read_text())
    assert record["eval_loss"] == resumed.best_eval_loss <= first.best_eval_loss
    if record["eval_loss"] == first.best_eval_loss:
        assert _digest(wd / "best-checkpoint") == before["best-checkpoint"]

    # replacing it: its checkpoints and best are deleted, the printed checkpoint is the new run's and exists
    replaced = Trainer(**tiny_job(wd, total_step=1, checkpoint_interval=2, checkpoint_maxkeep=2, eval_interval=1,
                                  dataset=EVAL, overwrite=True)).fit()
    assert replaced.run_id != first.run_id
    assert [p.name for _, p in store.list_checkpoints(wd / "checkpoints")] == ["step-00000001"]
    assert Path(replaced.checkpoint).is_dir()
    assert json.loads((wd / "best-checkpoint.json").read_text())["run_id"] == replaced.run_id

    # the jsonl tracker kept both runs (appended, never rewritten), the first one's records intact
    runs = read_records(wd / "logs" / "metrics.jsonl")
    assert list(runs) == [first.run_id, replaced.run_id]
    assert [r["step"] for r in runs[first.run_id] if "loss" in r] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in runs[replaced.run_id] if "loss" in r] == [1]

    # twinkle plot draws the newest run (or the one asked for) and prints a summary
    from twinkle.trainer.plot import plot

    drawn = plot(wd, run=first.run_id)
    assert drawn.png.is_file() and drawn.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    losses = [r["loss"] for r in runs[first.run_id] if "loss" in r]
    assert drawn.series["loss"] == ([1, 2, 3, 4, 5, 6], losses)
    assert drawn.series["eval_loss"][0] == [2, 4, 6] and set(drawn.series) >= {"lr", "grad_norm", "tokens_per_second"}
    drawn_lines = {line.get_label(): list(line.get_ydata()) for axis in drawn.figure.axes for line in axis.get_lines()}
    assert drawn_lines["train loss"] == losses
    proc = subprocess.run([sys.executable, "-m", "twinkle.cli.main", "plot", str(wd)], capture_output=True, text=True,
                          env=cli_env(), timeout=120)
    assert proc.returncode == 0 and f"run {replaced.run_id}" in proc.stdout and "curves" in proc.stdout


def test_rotation_never_deletes_the_checkpoint_it_just_wrote(tmp_path: Path) -> None:
    """The old failure: a new run's step-3 beside an earlier run's step-24 and step-32 was the oldest by step."""
    root = tmp_path / "checkpoints"
    for step in (24, 32, 3):
        store.write_checkpoint(root, step, lambda tmp: (tmp / "model").mkdir(), {"step": step})
    gone = store.rotate(root, 2, written=root / "step-00000003")
    assert [p.name for p in gone] == ["step-00000024"]
    assert sorted(p.name for _, p in store.list_checkpoints(root)) == ["step-00000003", "step-00000032"]


def test_plot_without_matplotlib_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from twinkle.trainer import plot as plot_module

    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "metrics.jsonl").write_text(json.dumps({"run": "r", "step": 1, "loss": 1.0}) + "\n")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(plot_module.PlotError, match=r"needs matplotlib: pip install 'twinkle-core\[plot\]'"):
        plot_module.plot(tmp_path)
