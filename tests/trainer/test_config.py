"""TrainerConfig validates eagerly and names the field; files, overrides and the CLI parse the same way."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from twinkle.cli.train_cmd import parse
from twinkle.trainer import ConfigError, Trainer, TrainerConfig


@pytest.mark.parametrize("data, message", [
    ({"total_step": 3, "optimizer": {"lrr": 1e-3}}, "optimizer.lrr: unknown field; did you mean 'lr'?"),
    ({"total_stepp": 3}, "total_stepp: unknown field; did you mean 'total_step'?"),
    ({"total_step": 3, "total_epoch": 1}, "set exactly one of them"),
    ({}, "set exactly one of them"),
    ({"total_step": 3, "checkpoint_interval": -5}, "checkpoint_interval: invalid value -5; expected int >= 1 or -1 "
                                                   "or none"),
    ({"total_step": 3, "hf_max_keep": 0}, "hf_max_keep: invalid value 0; expected int >= 1 or -1 or none"),
    ({"total_step": 3, "exp_tracker": "tensorbord"}, "did you mean 'tensorboard'?"),
    ({"total_step": 3, "lora": {"r": 0}}, "lora.r: invalid value 0; expected int >= 1"),
    ({"total_step": "three"}, "total_step: invalid value 'three'; expected int or none"),
    ({"total_step": 3, "global_batch_size": 6, "dataloader": {"gradient_accumulation_steps": 4}},
     "global_batch_size: 6 is not divisible"),
    ({"total_step": 3, "eval_interval": 2}, "eval_interval: evaluation needs dataset.eval_samples > 0"),
    ({"total_step": 3, "profile_step": [0]}, "profile_step: invalid value 0; expected int or list of int >= 1"),
    ({"total_step": 3, "model": {"mixed_precision": "bf32"}}, "model.mixed_precision"),
    ({"total_step": 3, "infra": {"dp_size": 0}}, "infra.dp_size: invalid value 0; expected int >= 1"),
    ({"total_step": 3, "work_dir": 3}, "work_dir: invalid value 3; expected path or none, got int"),
])
def test_bad_config_names_the_field(data: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        TrainerConfig.from_dict(data)
    assert message in str(info.value)


def test_yaml_and_toml_give_the_same_config_and_overrides_win(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("total_step: 5\noptimizer:\n  lr: 0.01\nlora:\n  r: 4\n")
    (tmp_path / "job.toml").write_text("total_step = 5\n[optimizer]\nlr = 0.01\n[lora]\nr = 4\n")
    from_yaml = TrainerConfig.from_file(tmp_path / "job.yaml")
    assert from_yaml == TrainerConfig.from_file(tmp_path / "job.toml")
    assert (from_yaml.total_step, from_yaml.optimizer.lr, from_yaml.lora.r) == (5, 0.01, 4)
    changed = TrainerConfig.from_file(tmp_path / "job.yaml", {"optimizer.lr": "1e-4", "lora.enabled": "false"})
    assert changed.optimizer.lr == 1e-4 and changed.lora.enabled is False and changed.lora.r == 4


def test_cli_overrides_parse_flags_and_dotted_keys() -> None:
    config = parse(["--optimizer.lr", "1e-3", "--auto-resume", "--no-progress-bar", "--lora.no-enabled",
                    "--total-step=7"], job={})
    assert (config.total_step, config.auto_resume, config.progress_bar, config.lora.enabled) == (7, True, False, False)
    assert config.optimizer.lr == 1e-3
    with pytest.raises(ConfigError, match="unexpected argument 'stray'"):
        parse(["--total-step", "7", "stray"], job={})


def test_paths_are_accepted_where_a_field_is_str_or_path(tmp_path: Path) -> None:
    config = TrainerConfig(total_step=1, work_dir=tmp_path / "wd", log_dir=tmp_path / "logs")
    assert config == TrainerConfig.from_dict({"total_step": 1, "work_dir": str(tmp_path / "wd"),
                                              "log_dir": str(tmp_path / "logs")})
    assert config.work_dir == str(tmp_path / "wd")


def test_unwritable_work_dir_fails_before_anything_loads(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ConfigError, match="work_dir: .* is not a writable directory"):
        Trainer(total_step=2, work_dir=str(blocker / "sub"))


def test_twinkle_train_reports_config_errors_without_training(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "twinkle.cli.main", "train", "--optimizer.lrr", "1"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "optimizer.lrr: unknown field; did you mean 'lr'?" in proc.stderr
    assert not (tmp_path / "output").exists()  # nothing created, nothing loaded


def test_importing_the_trainer_loads_no_torch() -> None:
    code = ("import sys, twinkle.trainer, twinkle.cli.train_cmd; "
            "from twinkle.trainer import TrainerConfig; TrainerConfig(total_step=1); "
            "print(sorted(m for m in ('torch', 'transformers', 'peft') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
