"""The groups and fields the reference user script (tests/trainer/test_seed003.py) reads, their defaults,
LoRA kwargs for peft, and a cheap import."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from twinkle.cli import CLI, LoraArgs

# (group, field) -> accepted types, for every attribute the reference user script reads
SEED_003_FIELDS = {
    ("infra", "fsdp_size"): (int,), ("infra", "dp_size"): (int, type(None)), ("infra", "mode"): (str,),
    ("dataset", "dataset_id"): (str,), ("template", "template_cls"): (str,), ("model", "model_id"): (str,),
    ("template", "max_length"): (int,), ("template", "truncation_strategy"): (str,),
    ("training", "output_dir"): (str,), ("lora", "adapter_name"): (str,),
    ("training", "eval_samples"): (int, type(None)), ("training", "batch_size"): (int,),
    ("training", "train_samples"): (int, type(None)), ("model", "enable_liger"): (bool,),
    ("model", "enable_fused_ce"): (bool,), ("training", "gradient_accumulation_steps"): (int,),
    ("optimizer", "learning_rate"): (float,), ("scheduler", "scheduler_cls"): (str,),
    ("scheduler", "num_warmup_steps"): (int,), ("training", "resume_from_checkpoint"): (str, type(None)),
    ("training", "resume_only_model"): (bool,), ("training", "ignore_data_skip"): (bool,),
    ("training", "eval_interval"): (int, type(None)), ("training", "log_interval"): (int,),
}


def test_every_field_seed_003_reads_exists_with_a_sane_default(parse):
    args = parse()
    for (group, name), types in SEED_003_FIELDS.items():
        value = getattr(getattr(args, group), name)
        assert type(value) in types, f"{group}.{name} = {value!r}"
    assert args.training.log_interval >= 1 and args.training.batch_size >= 1  # seed does `step % log_interval`
    assert args.extra.get("model_name", "fallback") == "fallback"
    assert isinstance(args.get_lora_args(), dict)


def test_project_defaults(parse):
    args = parse()
    assert (args.infra.mode, args.infra.dp_size, args.infra.fsdp_size) == ("local", None, 1)
    assert (args.model.model_id, args.model.enable_liger, args.model.enable_fused_ce) == (
        "twinkle://tiny-qwen", False, True)
    assert args.dataset.dataset_id == "twinkle://self-cognition"
    assert (args.template.template_cls, args.template.max_length, args.template.truncation_strategy) == (
        "Template", 512, "delete")
    assert (args.lora.adapter_name, args.lora.r, args.lora.lora_alpha, args.lora.lora_dropout) == (
        "default", 8, 32, 0.05)
    assert args.training.output_dir == "output" and args.training.resume_from_checkpoint is None
    assert (args.optimizer.optimizer_cls, args.scheduler.scheduler_cls) == ("AdamW", "CosineWarmupScheduler")


def test_choice_lists_match_the_modules_that_consume_them():
    from twinkle.cli import args_groups
    from twinkle.config import schema_of
    from twinkle.precision import MIXED_PRECISION
    from twinkle.runtime import MODES
    from twinkle.template import TRUNCATION_STRATEGIES

    specs = schema_of(CLI).specs
    assert specs[("infra", "mode")].choices == MODES and args_groups.MODES is MODES
    assert specs[("model", "mixed_precision")].choices == MIXED_PRECISION
    assert specs[("template", "truncation_strategy")].choices == TRUNCATION_STRATEGIES


def test_importing_twinkle_cli_loads_no_heavy_or_optional_module():
    code = ("import sys, json; from twinkle.cli import CLI; CLI.parse([], environ={}); "
            "print(json.dumps(sorted({'torch', 'yaml', 'peft', 'transformers', 'tomli'} & set(sys.modules))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_get_lora_args_builds_a_real_peft_lora_config(parse):
    import torch
    from peft import LoraConfig, inject_adapter_in_model

    args = parse("--r", "4", "--lora-alpha", "16", "--lora-dropout", "0", "--modules-to-save", "head")
    config = LoraConfig(**args.get_lora_args())
    assert (config.r, config.lora_alpha, config.lora_dropout) == (4, 16, 0.0)
    assert config.target_modules == "all-linear"  # peft's shorthand must stay a string
    assert set(config.modules_to_save) == {"head"}

    # a single plain module name must reach peft as a list: as a string it would be a regex matching nothing
    args = parse("--target-modules", "q_proj")
    assert args.lora.target_modules == "q_proj"
    attn = torch.nn.Module()
    attn.q_proj, attn.v_proj = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    model = torch.nn.Sequential(attn)
    inject_adapter_in_model(LoraConfig(**args.get_lora_args()), model)
    assert hasattr(model[0].q_proj, "lora_A") and not hasattr(model[0].v_proj, "lora_A")


@pytest.mark.parametrize(("argv", "expected"), [
    (["--target-modules", "q_proj,v_proj"], ["q_proj", "v_proj"]),
    (["--target-modules", "q_proj", "--target_modules", "v_proj"], ["q_proj", "v_proj"]),
    (["--target-modules", r".*\.(q|v)_proj"], r".*\.(q|v)_proj"),
    (["--target-modules", "all-linear"], "all-linear"),
])
def test_target_modules_forms(parse, argv, expected):
    assert parse(*argv).get_lora_args()["target_modules"] == expected


def test_to_dict_is_nested_by_group_and_detached(parse):
    args = parse("--batch-size", "3", "--extra.run-tag", "x")
    data = args.to_dict()
    assert data["training"]["batch_size"] == 3 and data["extra"] == {"run_tag": "x"}
    assert set(data) == {"infra", "model", "lora", "dataset", "template", "training", "optimizer", "scheduler",
                         "extra"}
    json.dumps(data)  # loggable as is
    data["training"]["batch_size"] = 99
    assert args.training.batch_size == 3


def test_groups_are_plain_dataclasses_usable_directly():
    assert LoraArgs(r=16).r == 16
    assert CLI().training.batch_size == CLI.parse([], environ={}).training.batch_size
