"""Issue 13 item 9: a second run on a work_dir in use fails fast, naming the first; a dead run's lock is stale."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from trainer_testing import cli_env, tiny_job, train_cmd, write_config

from twinkle.trainer import Trainer, store

HOLD = """
import sys, time
from pathlib import Path
from twinkle.trainer.lock import WorkDirLock
lock = WorkDirLock(Path(sys.argv[1]))  # held (referenced) until this process ends
lock.acquire()
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
"""


def _holder(work_dir: Path, seconds: float) -> subprocess.Popen:
    work_dir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(work_dir), str(seconds)], stdout=subprocess.PIPE,
                            text=True, env=cli_env())
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_live_holder_is_named_and_nothing_is_touched(tmp_path) -> None:
    from twinkle.trainer.lock import WorkDirLockedError

    wd = tmp_path / "wd"
    stale_tmp = wd / "checkpoints" / ".step-00000002.tmp-123-abc"
    stale_tmp.mkdir(parents=True)  # what the holder may be writing right now
    holder = _holder(wd, 60)
    try:
        match = rf"in use by another run \(pid {holder.pid} on .*another work_dir"
        with pytest.raises(WorkDirLockedError, match=match):
            Trainer(**tiny_job(wd)).fit()
        assert stale_tmp.is_dir()
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_left_by_a_killed_run_is_taken_over(tmp_path, caplog) -> None:
    from twinkle.trainer.lock import WorkDirLock

    wd = tmp_path / "wd"
    holder = _holder(wd, 60)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    caplog.set_level(logging.INFO, logger="twinkle")
    lock = WorkDirLock(wd)
    lock.acquire()
    try:
        assert f"took over a stale lock of pid {holder.pid}" in caplog.text
    finally:
        lock.release()


@pytest.mark.slow
def test_a_second_fit_never_deletes_the_first_runs_in_flight_checkpoint(tmp_path) -> None:
    wd = tmp_path / "wd"
    config = write_config(tmp_path / "job.yaml", tiny_job(wd, total_step=4))
    first = subprocess.Popen(train_cmd(config), cwd=tmp_path, env=cli_env(TWINKLE_TRAINER_TEST_SAVE_SLEEP="4"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        root, deadline = wd / "checkpoints", time.monotonic() + 120
        while not (root.is_dir() and any(".tmp-" in p.name for p in root.iterdir())):
            assert first.poll() is None and time.monotonic() < deadline, "the first run never started a save"
            time.sleep(0.05)
        in_flight = next(p for p in root.iterdir() if ".tmp-" in p.name)
        with pytest.raises(RuntimeError, match=rf"pid {first.pid}"):
            Trainer(**tiny_job(wd, total_step=4)).fit()
        assert in_flight.is_dir() or (root / in_flight.name.split(".tmp-")[0].lstrip(".")).is_dir()
        assert first.wait(timeout=180) == 0, first.stderr.read()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert [s for s, _ in store.complete_checkpoints(root, checksums=True)] == [2, 4]
