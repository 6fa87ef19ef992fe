"""Command-line syntax: flags, --group.field, ambiguity, mistyped values, extras, --help and exit codes."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from twinkle.cli import CLI, CLIError, CLIHelpRequested


@dataclass
class RolloutArgs:
    batch_size: int = 2
    temperature: float = 1.0


@dataclass
class RolloutCLI(CLI):
    """A script's own CLI with a group whose batch_size clashes with training.batch_size."""

    rollout: RolloutArgs = field(default_factory=RolloutArgs)


def test_seed_flags_no_fused_ce_and_enable_liger(parse):
    args = parse("--enable-liger", "--no-fused-ce")
    assert args.model.enable_liger is True and args.model.enable_fused_ce is False


@pytest.mark.parametrize("argv", [["--no-enable-fused-ce"], ["--model.no-fused-ce"], ["--enable_fused_ce=false"],
                                  ["--fused-ce", "false"], ["--model.enable-fused-ce", "off"]])
def test_every_spelling_of_fused_ce_off(parse, argv):
    assert parse(*argv).model.enable_fused_ce is False


def test_negated_flag_refuses_a_value(parse):
    with pytest.raises(CLIError, match="--no-fused-ce takes no value"):
        parse("--no-fused-ce=true")


def test_group_dot_field_dash_underscore_and_equals(parse):
    args = parse("--training.batch-size", "6", "--infra.fsdp_size=2", "--gradient_accumulation-steps", "3",
                 "--learning-rate=5e-4", "--lr", "2e-4")
    assert (args.training.batch_size, args.infra.fsdp_size, args.training.gradient_accumulation_steps) == (6, 2, 3)
    assert args.optimizer.learning_rate == 2e-4  # later --lr alias wins; exact: float("2e-4") of the argument


def test_optional_fields_accept_none_and_negative_values_are_values(parse):
    args = parse("--dp-size", "4", "--dp-size", "none", "--resume-from-checkpoint", "ckpt/last")
    assert args.infra.dp_size is None and args.training.resume_from_checkpoint == "ckpt/last"
    with pytest.raises(CLIError, match=r"--seed: invalid value '-1'; expected int >= 0"):
        parse("--seed", "-1")


def test_ambiguous_field_names_both_groups(parse):
    with pytest.raises(CLIError) as err:
        parse("--batch-size", "8", cls=RolloutCLI)
    message = str(err.value)
    assert "ambiguous" in message and "--training.batch-size" in message and "--rollout.batch-size" in message
    args = parse("--training.batch-size", "8", "--rollout.batch_size", "5", "--temperature", "0.7", cls=RolloutCLI)
    assert (args.training.batch_size, args.rollout.batch_size, args.rollout.temperature) == (8, 5, 0.7)


@pytest.mark.parametrize(("argv", "needle"), [
    (["--batch-size", "abc"], "--batch-size: invalid value 'abc'; expected int"),
    (["--learning-rate", "fast"], "--learning-rate: invalid value 'fast'; expected float"),
    (["--enable-liger=maybe"], "--enable-liger: invalid value 'maybe'; expected bool"),
    (["--mode", "cloud"], "--mode: invalid value 'cloud'; expected {local,ray}"),
    (["--truncation-strategy", "cut"], "expected {raise,left,right,delete}"),
    (["--batch-size", "0"], "expected int >= 1"),
    (["--lora-dropout", "1.5"], "expected float <= 1.0"),
    (["--batch-size", "none"], "--batch-size: invalid value 'none'; expected int"),
    (["--batch-size"], "--batch-size needs a value (int)"),
    (["--output-dir", "--seed", "1"], "--output-dir needs a value"),
    (["--training.bach-size", "4"], "--training.bach-size: unknown field; did you mean 'batch_size'?"),
    (["stray"], "unexpected argument 'stray'"),
])
def test_mistyped_values_name_option_value_and_type(parse, argv, needle):
    with pytest.raises(CLIError) as err:
        parse(*argv)
    assert needle in str(err.value)


def test_error_carries_option_value_and_expected_type(parse):
    with pytest.raises(CLIError) as err:
        parse("--max-length", "long")
    assert (err.value.option, err.value.value, err.value.expected) == ("--max-length", "long", "int")
    assert isinstance(err.value, ValueError)


def test_unknown_options_go_to_extra_with_parsed_types_when_allowed(parse):
    args = parse("--model-name", "twinkle大模型", "--model_author=ModelScope", "--n-shots", "3", "--temp", "0.5",
                 "--dry-run", "--use-cache", "false", "--stop", "none", "--no-color", "--offset", "-2",
                 "--tag", "nan", allow_extra=True)
    assert args.extra == {"model_name": "twinkle大模型", "model_author": "ModelScope", "n_shots": 3, "temp": 0.5,
                          "dry_run": True, "use_cache": False, "stop": None, "color": False, "offset": -2,
                          "tag": "nan"}
    assert type(args.extra["n_shots"]) is int and type(args.extra["temp"]) is float


def test_a_misspelt_option_is_an_error_not_an_extra(parse):
    with pytest.raises(CLIError, match=r"--learning-rat: unknown option; did you mean --learning-rate\? A script's "
                                       r"own option is declared.*--extra.learning-rat.*allow_extra=True") as err:
        parse("--learning-rat", "0.5")
    assert (err.value.option, err.value.value) == ("--learning-rat", "learning_rat")
    with pytest.raises(CLIError, match=r"--no-colour: unknown option"):
        parse("--no-colour")


def test_declared_extras_pass(parse, tmp_path):
    assert parse("--extra.run-tag", "x", "--extra.no-color").extra == {"run_tag": "x", "color": False}
    assert parse("--model-name", "mine", model_name="default").extra == {"model_name": "mine"}  # declared by default
    assert parse("--run-tag", "x", env={"TWINKLE_EXTRA__RUN_TAG": "y"}).extra == {"run_tag": "x"}
    config = tmp_path / "job.yaml"
    config.write_text("extra:\n  run_tag: file\n")
    assert parse("--config", str(config), "--run-tag", "x").extra == {"run_tag": "x"}


def test_an_unknown_top_level_key_in_a_config_file_is_an_error(parse, tmp_path):
    config = tmp_path / "job.yaml"
    config.write_text("learning_rat: 0.5\n")
    with pytest.raises(CLIError, match=r"job.yaml: learning_rat: unknown option; did you mean --learning-rate"):
        parse("--config", str(config))
    assert parse("--config", str(config), allow_extra=True).extra == {"learning_rat": 0.5}


def test_list_fields_comma_separated_or_repeated(parse):
    args = parse("--modules-to-save", "lm_head,embed_tokens", "--modules-to-save", "norm")
    assert args.lora.modules_to_save == ["lm_head", "embed_tokens", "norm"]


def test_help_lists_every_option_with_group_type_and_default(parse, help_entries):
    with pytest.raises(CLIHelpRequested) as got:
        parse("--batch-size", "2", "--help")
    text = got.value.text
    entries = help_entries(text)
    assert entries["--training.batch-size"].startswith("--training.batch-size, --batch-size INT ")
    assert entries["--training.batch-size"].endswith("rows per micro-batch (int >= 1; default: 4)")
    assert entries["--infra.dp-size"].endswith("(int >= 1 or none; default: none)")
    assert "--model.[no-]enable-fused-ce, --[no-]enable-fused-ce, --[no-]fused-ce" in text
    assert entries["--model.enable-fused-ce"].endswith("(default: true)")
    assert "--infra.mode, --mode {local,ray}" in text and "TWINKLE_<GROUP>__<NAME>" in text and "--config FILE" in text
    for group in ("infra", "model", "lora", "dataset", "template", "training", "optimizer", "scheduler"):
        assert f"\n{group}: " in text
    from twinkle.config import schema_of

    for spec in schema_of(CLI).specs.values():
        assert spec.help in entries[spec.option], spec.dotted  # every option, with its help
    clashing = RolloutCLI.help_text("x")
    assert "--training.batch-size INT" in clashing and "--rollout.batch-size INT" in clashing


SCRIPT = "from twinkle.cli import CLI\nargs = CLI.from_args()\nprint('batch', args.training.batch_size)\n"


def _run_script(tmp_path, *argv: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT, encoding="utf-8")
    return subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=60)


def test_from_args_in_a_script_help_exit_0_and_bad_value_exit_2(tmp_path):
    ok = _run_script(tmp_path, "--batch-size", "7")
    assert ok.returncode == 0 and ok.stdout.strip() == "batch 7"
    shown = _run_script(tmp_path, "--help")
    assert shown.returncode == 0 and shown.stdout.startswith("usage: train.py") and "batch 7" not in shown.stdout
    bad = _run_script(tmp_path, "--batch-size", "abc")
    assert bad.returncode == 2 and bad.stdout == ""
    assert "train.py: error: --batch-size: invalid value 'abc'; expected int" in bad.stderr


def test_from_args_reads_sys_argv_and_takes_script_defaults(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["train.py", "--eval-interval", "5"])
    args = CLI.from_args(training={"batch_size": 16}, log_interval=2, model_name="mine")
    assert (args.training.eval_interval, args.training.batch_size, args.training.log_interval) == (5, 16, 2)
    assert args.extra == {"model_name": "mine"}
    monkeypatch.setattr(sys, "argv", ["train.py", "--mode", "cloud"])
    with pytest.raises(SystemExit) as exit_info:
        CLI.from_args()
    assert exit_info.value.code == 2 and "--mode: invalid value 'cloud'" in capsys.readouterr().err
