"""`twinkle train` on the command line: --help with the real defaults, names without their group, the
exactly-one-of rule after merging, one-block errors found before anything loads, and clean progress output."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from twinkle.cli.main import main
from twinkle.cli.train_cmd import DEFAULT_JOB, parse, progress
from twinkle.config import schema_of
from twinkle.trainer import ConfigError, TrainerConfig


def test_help_describes_every_option_with_the_default_job_values(capsys, help_entries):
    assert main(["train", "--help"]) == 0
    lines = help_entries(capsys.readouterr().out)
    for spec in schema_of(TrainerConfig).specs.values():
        assert spec.help and spec.help in lines[spec.option], spec.dotted  # every option is described
    # the no-argument job's values, and TrainerConfig's where a config file would differ
    assert "default: output/twinkle-train; config file: work_dir)" in lines["--work-dir"]
    assert "default: 2; config file: none)" in lines["--total-epoch"]
    assert "default: none)" in lines["--total-step"] and "config file" not in lines["--total-step"]
    assert "default: 8; config file: none)" in lines["--eval-interval"]
    assert "default: 2; config file: -1)" in lines["--checkpoint-maxkeep"]
    assert lines["--optimizer.lr"].startswith("--optimizer.lr, --lr FLOAT ")


def _config(*argv: str, base: dict | None = None) -> TrainerConfig:
    return parse(list(argv), DEFAULT_JOB if base is None else base)


def test_a_later_total_step_or_total_epoch_replaces_the_other():
    cfg = _config("--total-step", "12")
    assert (cfg.total_step, cfg.total_epoch) == (12, None)
    cfg = _config("--total-epoch", "3", base={"total_step": 5})
    assert (cfg.total_step, cfg.total_epoch) == (None, 3)
    with pytest.raises(ConfigError, match="set exactly one of them"):
        _config("--total-step", "2", "--total-epoch", "1")


def test_names_without_their_group_and_the_lr_of_docs_cli():
    cfg = _config("--lr", "1e-4", "--max-length", "64", "--r", "4", "--seed", "7")
    assert (cfg.optimizer.lr, cfg.dataset.max_length, cfg.lora.r, cfg.seed) == (1e-4, 64, 4, 7)
    assert cfg.lr.scheduler == "CosineWarmupScheduler"  # the lr group itself is untouched
    with pytest.raises(ConfigError, match=r"--kwargs is ambiguous: write one of --model.kwargs, "):
        parse(["--kwargs", "{}"])


@pytest.mark.parametrize(("argv", "words"), [
    (["--seed", "-1"], "--seed: invalid value '-1'; expected int >= 0."),
    (["--model.type", "NoSuchModel"], "model.type: Unknown model 'NoSuchModel'. Known model names:"),
    (["--dataset.template", "Nope"], "dataset.template: Unknown template 'Nope'"),
    (["--infra.fsdp-size", "2"], "infra: DeviceMesh: world size 1 is not divisible"),
    (["--total-step", "0"], "--total-step: invalid value '0'; expected int >= 1"),
])
def test_config_errors_are_one_block_before_anything_loads(tmp_path, monkeypatch, capsys, argv, words):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("twinkle.trainer.setup.build_dataset", _never)  # found before the data loads
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"twinkle train: error: {err.split('error: ', 1)[1]}" and words in err
    assert "Traceback" not in err and err.rstrip().endswith("(run with --debug for the traceback)")
    assert list(tmp_path.iterdir()) == []  # no work dir left behind
    with pytest.raises(ConfigError):
        main(["train", *argv, "--debug"])


def _never(*args, **kwargs):
    raise AssertionError("the dataset was loaded before the error was found")


def test_a_run_time_error_is_one_block_and_leaves_no_work_dir(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    missing = str(tmp_path / "missing.jsonl")  # an id that does not resolve is a bad value of its option: 2
    assert main(["train", "--dataset.dataset-id", missing]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"twinkle train: error: --dataset.dataset-id {missing!r}: no such local file or directory")
    assert "Traceback" not in err
    assert not (tmp_path / "output").exists()


def test_log_lines_and_library_bars_do_not_break_the_training_bar(capsys):
    from transformers.utils import logging as hf_logging

    class FakeTrainer:
        on_step = None

    trainer = FakeTrainer()
    with progress(trainer, enabled=True):
        assert not hf_logging.is_progress_bar_enabled()  # e.g. "Writing model shards" of a checkpoint
        trainer.on_step(1, 4, {"loss": 1.0, "lr": 1e-3, "tokens_per_second": 10.0})
        logging.getLogger("twinkle").info("checkpoint written")
        trainer.on_step(2, 4, {"loss": 0.9, "lr": 1e-3, "tokens_per_second": 10.0})
    assert hf_logging.is_progress_bar_enabled()
    err = capsys.readouterr().err
    assert re.search(r"(^|[\r\n])\[INFO:twinkle\] checkpoint written\n", err), repr(err)
    names = [type(h).__name__ for h in logging.getLogger("twinkle").handlers]
    assert "_StderrHandler" in names and "_AboveBar" not in names  # put back


def test_no_progress_bar_changes_nothing():
    class FakeTrainer:
        on_step = None

    trainer = FakeTrainer()
    with progress(trainer, enabled=False):
        assert trainer.on_step is None


def test_the_debug_flag_is_not_an_option_name(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^--seed: invalid value"):  # --debug is taken out, wherever it stands
        main(["train", "--seed", "-1", "--debug"])
