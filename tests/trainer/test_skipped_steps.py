"""The Trainer with diverging weights: inf/NaN steps are skipped (not logged as steps), and after
``optimizer.max_consecutive_skips`` skips in a row fit() stops with an error naming the step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trainer_testing import tiny_job

from twinkle.model.optimizer_group import TooManySkippedStepsError
from twinkle.trainer import ConfigError, Trainer


def test_a_diverged_run_stops_naming_the_step(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # lr 1e30: the first AdamW step puts the adapter weights at ~1e30, every later forward overflows to inf/NaN
    job = tiny_job(tmp_path / "wd", total_step=6, checkpoint_interval=1, log_interval=1,
                   optimizer={"lr": 1e30, "max_consecutive_skips": 3})
    with pytest.raises(TooManySkippedStepsError, match=r"Training stopped at step 2 of group 'default': 3 "
                                                        r"optimizer steps in a row were skipped"):
        Trainer(**job).fit()
    assert caplog.text.count("Skipped step 2 of group 'default'") == 2  # warned before the limit
    records = [json.loads(line) for line in (tmp_path / "wd" / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1]  # the skipped windows were not logged as steps


def test_max_consecutive_skips_is_validated(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="optimizer.max_consecutive_skips: invalid value 0; expected int >= 1"):
        Trainer(**tiny_job(tmp_path / "wd", optimizer={"max_consecutive_skips": 0}))
