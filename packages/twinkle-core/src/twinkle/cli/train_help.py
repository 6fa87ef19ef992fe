"""``twinkle train --help``: one line per TrainerConfig option, with the default the command really uses.

Descriptions live here, keyed by the dotted field; a test keeps this table and TrainerConfig in step.
The default shown is the embedded job's value when ``twinkle train`` runs without a config file
(``DEFAULT_JOB`` over TrainerConfig's own defaults), and TrainerConfig's default when it differs
(what a config file that leaves the field out gets).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

FIELD_HELP: dict[str, str] = {
    "model.type": "registered model class (twinkle plugins --kind model)",
    "model.model_id": "weights: hub id (ms://, hf://), local directory or twinkle:// embedded model",
    "model.mixed_precision": "no | bf16 | fp16 | fp8",
    "model.strategy": "how the backend wraps the model for several processes (TransformersModel: accelerate | "
                      "native_fsdp); none = the backend's default",
    "model.gradient_checkpointing": "recompute activations in backward: less memory, the same losses",
    "model.kwargs": "extra constructor arguments of the model class (a table)",
    "lora.enabled": "train a LoRA adapter (false: the full model)",
    "lora.adapter_name": "adapter and optimizer-group name",
    "lora.r": "LoRA rank",
    "lora.alpha": "LoRA alpha (scaling = alpha / r)",
    "lora.dropout": "dropout on the LoRA input",
    "lora.target_modules": "layers to adapt: names (a,b,c), one regex or all-linear; none = all-linear "
                           "(plus lm_head on the tiny default)",
    "lora.modules_to_save": "modules trained in full and saved with the adapter",
    "lora.merge_on_export": "HF exports hold the merged model instead of the adapter",
    "optimizer.name": "registered optimizer (AdamW, Muon, SGD, ...)",
    "optimizer.lr": "peak learning rate (also --lr)",
    "optimizer.weight_decay": "weight decay",
    "optimizer.max_grad_norm": "gradient clipping norm (see do_clip)",
    "optimizer.max_consecutive_skips": "inf/NaN steps are skipped; this many in a row stop training",
    "optimizer.kwargs": "extra optimizer arguments (a table)",
    "lr.scheduler": "registered lr scheduler; none = constant lr",
    "lr.warmup_steps": "linear warm-up steps",
    "lr.kwargs": "extra scheduler arguments (a table)",
    "dataset.dataset_id": "training data: hub id, local file or twinkle:// embedded data",
    "dataset.template": "registered chat template (Template = the tokenizer's own)",
    "dataset.max_length": "tokens per row at most",
    "dataset.truncation_strategy": "rows over max_length: delete | left | right | raise",
    "dataset.preprocessor": "registered preprocessor turning rows into messages; none = rows are messages",
    "dataset.preprocessor_kwargs": "preprocessor arguments (a table)",
    "dataset.train_samples": "training rows to use; none = all",
    "dataset.eval_samples": "rows after the training rows held out for evaluation",
    "dataset.eval_dataset_id": "a separate evaluation dataset",
    "dataloader.gradient_accumulation_steps": "micro-batches per optimizer step",
    "dataloader.shuffle": "shuffle the rows (seeded, resumable)",
    "loss.name": "registered loss; none = the model's default (cross-entropy)",
    "loss.task": "forward flavour: causal_lm | fused_lm_ce | embedding",
    "loss.kwargs": "loss arguments (a table)",
    "infra.mode": "local (this process or each torchrun process) | ray",
    "infra.dp_size": "ray: data-parallel actors (under torchrun: what the processes leave)",
    "infra.fsdp_size": "FSDP shard-group size",
    "infra.tp_size": "tensor-parallel size (Megatron backend)",
    "infra.pp_size": "pipeline-parallel size (Megatron backend)",
    "infra.cp_size": "context (sequence) parallel size",
    "infra.sp_size": "xtuner's name for cp_size",
    "infra.ep_size": "expert-parallel size (MoE)",
    "infra.sequence_parallel": "shard activations along the sequence in tensor-parallel regions",
    "infra.device_type": "ray: cpu | gpu | npu actors",
    "infra.num_cpus": "ray: CPUs of the cluster this process starts",
    "infra.ray_address": "ray: join this cluster instead of starting one",
    "infra.timeout_s": "ray: seconds a remote call may take; local: collective timeout",
    "load_from": "start from these weights: an HF model directory or a twinkle train checkpoint",
    "global_batch_size": "rows per optimizer step over all data-parallel ranks",
    "total_step": "optimizer steps to train (replaces total_epoch)",
    "total_epoch": "passes over the data (replaces total_step)",
    "work_dir": "where checkpoints, logs and exports go",
    "checkpoint_interval": "resumable checkpoint every N steps (-1: only at the end)",
    "checkpoint_maxkeep": "checkpoints kept (-1: all)",
    "auto_resume": "continue from the newest complete checkpoint (or snapshot) in work_dir",
    "hf_interval": "HF-format export every N steps",
    "hf_max_keep": "HF exports kept",
    "exp_tracker": "jsonl | tensorboard",
    "log_interval": "write metrics every N steps",
    "eval_interval": "evaluate (and keep the best checkpoint) every N steps",
    "profile_step": "steps to record a torch.profiler trace of",
    "profile_time": "record each step's time",
    "profile_memory": "record memory in the traces",
    "seed": "random seed (>= 0)",
    "infra_mode": "older spelling of infra.mode",
    "progress_bar": "show the training progress bar",
    "tokenizer_path": "tokenizer to encode with and save in checkpoints; none = the model's",
    "log_dir": "metrics and train.log; none = work_dir/logs",
    "strict_load": "weights that do not fit the model are an error (false: a warning)",
    "do_clip": "clip gradients to optimizer.max_grad_norm (false: only report the norm)",
    "async_checkpoint": "write checkpoints in the background while training goes on",
    "snapshot_interval": "latest-only resumable snapshot every N steps, between full checkpoints",
}


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and not key.endswith("kwargs"):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def fields(config_cls: type | None = None) -> list[tuple[str, Any]]:
    """``(dotted name, default)`` of every option of a dataclass config (TrainerConfig unless given), in order."""
    from twinkle.trainer import TrainerConfig

    out: list[tuple[str, Any]] = []

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], f"{prefix}{f.name}.")
                continue
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            out.append((f"{prefix}{f.name}", default))

    walk(config_cls or TrainerConfig, "")
    return out


def _show(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def options_help(default_job: dict[str, Any] | None = None, config_cls: type | None = None) -> str:
    """The option list of ``twinkle train --help`` (``twinkle serve --help``: ``config_cls=ServerConfig``).

    ``default_job``: the values the command uses without a config file, shown as the defaults.
    """
    job = _flatten(default_job or {})
    lines = ["options (--field value or --group.field value; a field name alone when it is unique, e.g. "
             "--max-length; --flag / --no-flag for booleans" + ("; --debug shows tracebacks)." if job else ").")]
    if job:
        lines.append("default: what `twinkle train` with no config file uses; [config: X]: what a config file "
                     "that leaves the field out gets.")
    lines.append("")
    for name, default in fields(config_cls):
        shown = job.get(name, default)
        if "total_" in name and name not in job and any(k.startswith("total_") for k in job):
            shown = None  # exactly one of total_step / total_epoch: the default job sets the other
        note = f" [config: {_show(default)}]" if _show(shown) != _show(default) else ""
        lines.append(f"  --{name.replace('_', '-'):36} {FIELD_HELP.get(name, '')} (default: {_show(shown)}){note}")
    return "\n".join(lines)
