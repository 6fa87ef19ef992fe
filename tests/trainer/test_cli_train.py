"""`twinkle train`: the embedded default job end to end, and Ctrl-C stopping after a complete checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_testing import cli_env, tiny_job, write_config

from twinkle.trainer import store


def test_default_job_trains_the_embedded_model_and_prints_a_summary(tmp_path: Path) -> None:
    # the embedded default job, shortened to one epoch of 32 rows (4 steps) for the test
    proc = subprocess.run([sys.executable, "-m", "twinkle.cli.main", "train", "--total-epoch", "1",
                           "--dataset.train-samples", "32", "--eval-interval", "2", "--no-progress-bar"],
                          cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    work_dir = tmp_path / "output" / "twinkle-train"
    last = work_dir / "checkpoints" / "step-00000004"
    assert "twinkle train: finished at step 4/4" in proc.stdout
    assert f"checkpoint: {last}" in proc.stdout
    assert store.verify(last)["step"] == 4 and (last / "model" / "adapter_model.safetensors").is_file()
    records = [json.loads(line) for line in (work_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 4 and f"final loss {losses[-1]:.4f}" in proc.stdout
    assert (work_dir / "best-checkpoint" / "adapter_model.safetensors").is_file()
    # the final lines point to the curves; `twinkle plot` draws them from this work_dir
    assert f"twinkle plot {work_dir}" in proc.stdout
    from twinkle.trainer.plot import plot

    drawn = plot(work_dir)
    assert drawn.png.is_file() and drawn.png.stat().st_size > 10_000
    assert drawn.series["loss"] == ([1, 2, 3, 4], losses)
    assert drawn.series["eval_loss"][0] == [2, 4] and {"lr", "grad_norm", "tokens_per_second"} <= set(drawn.series)
    assert {line.get_label() for axis in drawn.figure.axes for line in axis.get_lines()} == {
        "train loss", "eval loss", "lr", "grad norm", "tokens/s"}


def test_ctrl_c_stops_after_saving_a_complete_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture) -> None:
    """A real SIGINT to this process at step 2 (sent from the tracker, so it lands mid-run deterministically)."""
    import twinkle.trainer.trainer as trainer_module
    from twinkle.cli.main import main

    real = trainer_module.make_tracker

    class SigintAtStep2:
        def __init__(self, *args: object) -> None:
            self.inner = real(*args)

        def log(self, step: int, record: dict) -> None:
            self.inner.log(step, record)
            if step == 2:
                os.kill(os.getpid(), signal.SIGINT)

        def close(self) -> None:
            self.inner.close()

    monkeypatch.setattr(trainer_module, "make_tracker", SigintAtStep2)
    before = signal.getsignal(signal.SIGINT)  # SIG_IGN when pytest was started in the background
    work_dir = tmp_path / "wd"
    config = write_config(tmp_path / "job.yaml", tiny_job(work_dir, total_step=1000, checkpoint_interval=-1))
    assert main(["train", str(config)]) == 130
    out = capsys.readouterr().out
    (step, path), = store.list_checkpoints(work_dir / "checkpoints")
    assert step == 2 and store.verify(path)["step"] == 2
    assert "twinkle train: interrupted at step 2/1000" in out and f"checkpoint: {path}" in out
    state = json.loads((path / "model" / "trainer_state.json").read_text())
    assert state["cur_step"] == 2 and state["consumed_train_samples"] == 8
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back
