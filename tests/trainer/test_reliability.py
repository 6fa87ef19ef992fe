"""The reliability proof: SIGKILL a `twinkle train` run at seeded random points (also mid-save),
restart it with auto_resume each time, and end with exactly the weights of an uninterrupted run."""

from __future__ import annotations

import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
from trainer_testing import assert_bitwise_equal, cli_env, load_weights, run_train, tiny_job, train_cmd, write_config

from twinkle.trainer import Trainer, store

TOTAL = 12
KILLS = 3  # alternating: mid-save, after a random step, mid-save


def _final_names_complete(root: Path) -> None:
    """Every directory under a checkpoint's final name verifies: nothing half-written is ever visible."""
    for _, path in store.list_checkpoints(root):
        try:
            store.verify(path)
        except Exception as exc:
            if path.exists():  # rotated out between listing and checking is fine
                raise AssertionError(f"half-written checkpoint under its final name: {path}: {exc}") from exc


def _records(work_dir: Path) -> int:
    """Step records in metrics.jsonl (appended by every run, so a restart adds to the count)."""
    path = work_dir / "logs" / "metrics.jsonl"
    return sum('"loss"' in line for line in path.read_text().splitlines()) if path.exists() else 0


def _run_and_kill(config: Path, work_dir: Path, mid_save: bool, rng: random.Random) -> str:
    """Start a run, SIGKILL it at the chosen point while watching the checkpoints; say where it died."""
    env = cli_env(TWINKLE_TRAINER_TEST_SAVE_SLEEP="1.5") if mid_save else cli_env()
    target = rng.randint(3, 5)  # steps this start makes before the kill: past the first checkpoint (step 2)
    proc = subprocess.Popen(train_cmd(config, "--auto-resume"), cwd=work_dir.parent, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    start_records = _records(work_dir)
    root = work_dir / "checkpoints"
    deadline = time.monotonic() + 120
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            _final_names_complete(root)
            if mid_save:
                if root.is_dir() and any(".tmp-" in p.name for p in root.iterdir()):
                    time.sleep(rng.uniform(0.0, 0.8))  # inside the 1.5 s window between files and rename
                    break
            elif _records(work_dir) >= start_records + target:
                time.sleep(rng.uniform(0.0, 0.05))
                break
            time.sleep(0.01)
        finished = proc.poll() is not None
        if not finished:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if finished:
        assert proc.returncode == 0, proc.stderr.read()[-3000:]
    _final_names_complete(root)
    if finished:
        return "finished"
    left = [p for p in root.iterdir() if ".tmp-" in p.name] if root.is_dir() else []
    return "mid-save" if mid_save and left else "killed"


@pytest.mark.slow
def test_sigkill_anywhere_then_auto_resume_matches_uninterrupted_run(tmp_path: Path) -> None:
    reference_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    Trainer(**tiny_job(reference_dir, total_step=TOTAL)).fit()  # the uninterrupted run (in this process)
    killed = write_config(tmp_path / "killed.yaml", tiny_job(killed_dir, total_step=TOTAL, checkpoint_maxkeep=2))

    rng = random.Random(1234)
    outcomes = [_run_and_kill(killed, killed_dir, mid_save=attempt % 2 == 0, rng=rng) for attempt in range(KILLS)]
    # the kills landed: some inside a save (its temporary directory is left behind, never a final name)
    assert outcomes.count("mid-save") >= 1 and outcomes.count("finished") == 0, outcomes
    final = run_train(killed, "--auto-resume", cwd=tmp_path)
    assert final.returncode == 0, final.stderr[-3000:]
    assert "auto_resume: resumed from" in final.stderr
    _final_names_complete(killed_dir / "checkpoints")
    assert not [p for p in (killed_dir / "checkpoints").iterdir() if ".tmp-" in p.name]  # cleaned on restart

    last = store.list_checkpoints(killed_dir / "checkpoints")[-1][1]
    assert store.verify(last)["step"] == TOTAL
    assert len(store.list_checkpoints(killed_dir / "checkpoints")) <= 2  # checkpoint_maxkeep
    ref_last = store.list_checkpoints(reference_dir / "checkpoints")[-1][1]
    assert_bitwise_equal(load_weights(last / "model"), load_weights(ref_last / "model"))
