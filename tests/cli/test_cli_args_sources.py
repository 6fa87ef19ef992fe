"""Sources and precedence: defaults < --config (YAML/TOML) < TWINKLE_<GROUP>__<FIELD> env < command line."""

from __future__ import annotations

import sys

import pytest

from twinkle.cli import CLI, CLIError

YAML = """
training:
  batch_size: 2
  log_interval: 3
  eval_interval: 30
  output-dir: from-file
model:
  enable_fused_ce: false
lora:
  target_modules: [q_proj, v_proj]
seed: 7
model_name: file-model
extra:
  model_author: file-author
"""

TOML = """
seed = 7
model_name = "file-model"

[training]
batch_size = 2
log_interval = 3
eval_interval = 30
output-dir = "from-file"

[model]
enable_fused_ce = false

[lora]
target_modules = ["q_proj", "v_proj"]

[extra]
model_author = "file-author"
"""


@pytest.mark.parametrize(("name", "text"), [("job.yaml", YAML), ("job.toml", TOML)])
def test_precedence_defaults_file_env_argv(parse, write, name, text):
    path = write(name, text)
    env = {"TWINKLE_TRAINING__BATCH_SIZE": "5", "TWINKLE_TRAINING__LOG_INTERVAL": "4",
           "TWINKLE_EXTRA__MODEL_NAME": "env-model"}
    args = parse("--config", path, "--batch-size", "9", env=env, training={"eval_samples": 11, "log_interval": 1})
    assert args.training.batch_size == 9  # argv > env > file > default
    assert args.training.log_interval == 4  # env > file > script default
    assert args.training.eval_interval == 30  # file > built-in default
    assert args.training.eval_samples == 11  # script default > built-in default
    assert args.training.output_dir == "from-file" and args.training.seed == 7  # '-' keys and flat keys
    assert args.model.enable_fused_ce is False and args.lora.target_modules == ["q_proj", "v_proj"]
    assert args.extra == {"model_name": "env-model", "model_author": "file-author"}
    assert args.training.gradient_accumulation_steps == 1  # untouched: built-in default


def test_each_layer_alone_overrides_the_default(parse, write):
    path = write("c.toml", "[infra]\nfsdp_size = 4\n")
    assert parse().infra.fsdp_size == 1
    assert parse("--config", path).infra.fsdp_size == 4
    assert parse("--config", path, env={"TWINKLE_INFRA__FSDP_SIZE": "2"}).infra.fsdp_size == 2
    assert parse(f"--config={path}", "--fsdp-size", "8", env={"TWINKLE_INFRA__FSDP_SIZE": "2"}).infra.fsdp_size == 8


def test_env_scheme_and_unrelated_twinkle_variables(parse):
    env = {"TWINKLE_MODEL__ENABLE_LIGER": "yes", "TWINKLE_INFRA__DP_SIZE": "none", "TWINKLE_LOG_LEVEL": "DEBUG",
           "TWINKLE_DEVICE": "cpu", "TWINKLE_OTHERTOOL__X": "1", "TWINKLE_OPTIMIZER__LR": "0.5"}
    args = parse(env=env)
    assert args.model.enable_liger is True and args.infra.dp_size is None
    assert args.optimizer.learning_rate == 0.5
    assert args.extra == {}  # TWINKLE_LOG_LEVEL and foreign groups are not ours


def test_process_environment_is_read_by_default(monkeypatch):
    monkeypatch.setenv("TWINKLE_TEMPLATE__MAX_LENGTH", "2048")
    assert CLI.parse([]).template.max_length == 2048


@pytest.mark.parametrize(("env", "needle"), [
    ({"TWINKLE_TRAINING__BATCH_SIZE": "big"}, "TWINKLE_TRAINING__BATCH_SIZE: invalid value 'big'; expected int"),
    ({"TWINKLE_TRAINING__BATCHSIZE": "4"}, "TWINKLE_TRAINING__BATCHSIZE: unknown field; did you mean 'batch_size'"),
])
def test_bad_environment_values_are_errors(parse, env, needle):
    with pytest.raises(CLIError, match=needle):
        parse(env=env)


@pytest.mark.parametrize(("name", "text", "needle"), [
    ("a.yaml", "training:\n  batch_sise: 4\n", r"a\.yaml: training\.batch_sise: unknown field; did you mean "
                                                 r"'batch_size'\?"),
    ("b.toml", "[training]\nbatch_size = 'four'\n", r"b\.toml: training\.batch_size: invalid value 'four'; "
                                                     r"expected int"),
    ("c.yaml", "training:\n  batch_size: 2.5\n", r"training\.batch_size: invalid value 2\.5; expected int, got float"),
    ("d.yaml", "model:\n  enable_liger: 1\n", r"model\.enable_liger: invalid value 1; expected bool, got int"),
    ("e.yaml", "training: 4\n", r"'training' is an option group and needs a table"),
    ("f.yaml", "- 1\n- 2\n", r"the top level must be a mapping"),
    ("g.toml", "[training\n", r"not valid TOML"),
    ("h.yaml", "a: [1\n", r"not valid YAML"),
    ("i.json", "{}", r"expected a \.yaml, \.yml or \.toml file"),
])
def test_bad_config_files_are_errors_naming_file_key_and_type(parse, write, name, text, needle):
    path = write(name, text)
    with pytest.raises(CLIError, match=needle):
        parse("--config", path)


def test_config_values_written_as_strings_are_parsed(parse, write):
    args = parse("--config", write("s.toml", '[training]\nbatch_size = "6"\n[lora]\ntarget_modules = "q,k"\n'))
    assert args.training.batch_size == 6 and args.lora.target_modules == ["q", "k"]


def test_missing_config_file_and_missing_path(parse, tmp_path):
    with pytest.raises(CLIError, match="cannot read it"):
        parse("--config", str(tmp_path / "absent.yaml"))
    with pytest.raises(CLIError, match="--config needs a file path"):
        parse("--config")


def test_empty_yaml_file_changes_nothing(parse, write):
    assert parse("--config", write("empty.yaml", "")).to_dict() == parse().to_dict()


def test_yaml_without_pyyaml_says_what_to_install(parse, write, monkeypatch):
    path = write("job.yaml", "training:\n  batch_size: 2\n")
    monkeypatch.setitem(sys.modules, "yaml", None)  # makes `import yaml` raise ImportError
    with pytest.raises(CLIError, match="reading YAML needs PyYAML: pip install pyyaml"):
        parse("--config", path)
    assert parse("--config", write("job.toml", "[training]\nbatch_size = 2\n")).training.batch_size == 2
