"""Issue 13 item 5 (lr part): NaN, inf or negative learning rates are refused everywhere they enter."""

from __future__ import annotations

import sys

import pytest
import torch

from twinkle.cli import CLI, CLIError
from twinkle.trainer import ConfigError, Trainer

BAD = [float("nan"), float("inf"), -1e-3]


@pytest.fixture(scope="module")
def model():
    from hostile_testing import lora_model

    return lora_model()


@pytest.mark.parametrize("lr", BAD)
def test_set_optimizer_refuses_a_bad_lr_and_keeps_the_old_optimizer(model, lr) -> None:
    group = model.optimizer_group["sft"]
    before = group.optimizer
    with pytest.raises(ValueError, match=rf"lr={lr!r}.*finite number >= 0"):
        model.set_optimizer("AdamW", lr=lr)
    instance = torch.optim.SGD(model.backend.parameters(group), lr=0.1)
    instance.param_groups[0]["lr"] = lr
    with pytest.raises(ValueError, match="finite number >= 0"):
        model.set_optimizer(instance)
    assert group.optimizer is before and group.lr_scheduler is not None


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "-0.1"])
def test_cli_parse_refuses_a_bad_lr_from_argv_and_env(text) -> None:
    with pytest.raises(CLIError, match="learning|lr"):
        CLI.parse(["--lr", text], environ={})
    with pytest.raises(CLIError, match="TWINKLE_OPTIMIZER__LEARNING_RATE"):
        CLI.parse([], environ={"TWINKLE_OPTIMIZER__LEARNING_RATE": text})


@pytest.mark.parametrize("lr", [*BAD, "nan"])
def test_trainer_config_refuses_a_bad_lr_before_loading_anything(tmp_path, lr) -> None:
    loaded = set(sys.modules)
    with pytest.raises(ConfigError, match="lr"):
        Trainer(work_dir=str(tmp_path / "wd"), optimizer={"lr": lr})
    assert not any(m.startswith("twinkle_hf") for m in set(sys.modules) - loaded)
