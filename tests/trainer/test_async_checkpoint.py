"""async_checkpoint: torch.distributed.checkpoint's async_save writes while the step loop goes on; a kill
mid-write leaves no checkpoint under a final name; a resume from an async checkpoint is exact."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_testing import assert_bitwise_equal, cli_env, load_weights, tiny_job, write_config

from twinkle.trainer import Trainer, store

SLOW_WRITES = """
import sys, time
import torch.distributed.checkpoint.filesystem as fs
write = fs.FileSystemWriter.write_data
def slow(self, plan, planner):
    time.sleep({delay})
    return write(self, plan, planner)
fs.FileSystemWriter.write_data = slow
"""


def test_training_goes_on_while_the_checkpoint_is_written_and_resume_is_exact(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    import torch.distributed.checkpoint.filesystem as fs

    write = fs.FileSystemWriter.write_data
    step_3_seen = threading.Event()

    def held(self, plan, planner):  # DCP's writer thread holds step 2's write until step 3 has run
        if "step-00000002" in str(self.path):  # (a fixed sleep raced a loaded machine's slower step)
            assert step_3_seen.wait(timeout=120), "step 3 never ran while step 2's checkpoint was being written"
        return write(self, plan, planner)

    monkeypatch.setattr(fs.FileSystemWriter, "write_data", held)
    job = tiny_job(tmp_path / "wd", total_step=6, checkpoint_interval=2, async_checkpoint=True)
    trainer = Trainer(**job)
    while_writing: list[int] = []

    def on_step(step: int, total: int, record: dict) -> None:
        pending = trainer._pending
        if pending is not None and not pending.done():
            while_writing.append(step)
            assert not pending.final.exists()  # only a temporary name while it is written
        if step == 3:
            step_3_seen.set()

    trainer.on_step = on_step
    result = trainer.fit()
    assert while_writing and while_writing[0] == 3  # step 3 ran while step 2's checkpoint was being written
    wd = tmp_path / "wd" / "checkpoints"
    assert [s for s, _ in store.list_checkpoints(wd)] == [2, 4, 6] and result.checkpoint == str(wd / "step-00000006")
    for _, path in store.list_checkpoints(wd):
        store.verify(path)
    assert (wd / "step-00000006" / "model" / "dcp_state").is_dir()  # DCP's format, on one process too
    assert not [p for p in wd.iterdir() if p.name.startswith(".")]

    reference = Trainer(**tiny_job(tmp_path / "ref", total_step=6, checkpoint_interval=2))
    reference.fit()
    ref = tmp_path / "ref" / "checkpoints" / "step-00000006" / "model"
    assert_bitwise_equal(load_weights(wd / "step-00000006" / "model"), load_weights(ref))
    shutil.rmtree(wd / "step-00000006")  # resume from the async step-4 checkpoint, in a new Trainer
    resumed = Trainer(**{**job, "auto_resume": True})
    assert resumed.fit().resumed_from == str(wd / "step-00000004")
    assert_bitwise_equal(load_weights(wd / "step-00000006" / "model"), load_weights(ref))


def test_a_kill_during_the_background_write_leaves_no_final_checkpoint(tmp_path: Path) -> None:
    wd = tmp_path / "wd"
    config = write_config(tmp_path / "job.yaml", tiny_job(wd, total_step=2, checkpoint_interval=1,
                                                          async_checkpoint=True))
    code = SLOW_WRITES.format(delay=30) + (
        "from twinkle.cli.main import main\n"
        f"sys.exit(main(['train', {str(config)!r}]))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    root = wd / "checkpoints"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any(root.glob(".step-00000001.tmp-*/.model.tmp-*/dcp_state")):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    time.sleep(1.0)  # the model's small files are on disk; DCP's writer sleeps
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert store.list_checkpoints(root) == []  # nothing under a final name
    assert list(root.glob(".step-00000001.tmp-*"))
    store.clean_stale(root)  # what the next start does
    assert list(root.iterdir()) == []
