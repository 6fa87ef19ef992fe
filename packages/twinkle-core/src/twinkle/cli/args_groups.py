"""The option groups of :class:`twinkle.cli.CLI`: one dataclass per group, typed, with project defaults.

Fields are declared with :func:`twinkle.config.opt` (help shown by ``--help``, choices, ranges, other
spellings such as ``--lr``); the values are checked whenever they arrive from a config file, the
environment, the command line or a constructor call, so a bad value fails at parse time, naming the
option, instead of deep inside a training job.
"""

from __future__ import annotations

from dataclasses import dataclass

from twinkle.config import Config, opt
from twinkle.constants import TRUNCATION_STRATEGIES
from twinkle.precision import MIXED_PRECISION
from twinkle.runtime import MODES


@dataclass
class InfraArgs(Config):
    """How the job is laid out: launch mode and the device-mesh sizes (``DeviceMesh.from_sizes``)."""

    mode: str = opt("local", "launch mode: 'local' (torchrun / one process) or 'ray'", choices=MODES)
    dp_size: int | None = opt(None, "data-parallel size; none = whatever is left of the world", min=1)
    fsdp_size: int = opt(1, "FSDP shard-group size", min=1)
    tp_size: int = opt(1, "tensor-parallel size", min=1)
    pp_size: int = opt(1, "pipeline-parallel size", min=1)
    cp_size: int = opt(1, "context-parallel size", min=1)
    ep_size: int = opt(1, "expert-parallel size", min=1)
    sequence_parallel: bool = opt(False, "shard activations along the sequence in TP regions")


@dataclass
class ModelArgs(Config):
    """Which model to load and how it runs."""

    model_id: str = opt("twinkle://tiny-qwen", "model id or path (hub id, local dir, or twinkle:// embedded model)")
    enable_liger: bool = opt(False, "use Liger kernels (gates the fused linear+CE loss)")
    enable_fused_ce: bool = opt(True, "with --enable-liger: fused linear+cross-entropy, no full logits tensor")
    mixed_precision: str = opt("bf16", "autocast precision", choices=MIXED_PRECISION)
    strategy: str = opt("accelerate", "wrapping strategy of the model backend (e.g. accelerate, native_fsdp)")


@dataclass
class LoraArgs(Config):
    """LoRA adapter settings; ``CLI.get_lora_args()`` turns them into ``peft.LoraConfig`` kwargs."""

    adapter_name: str = opt("default", "adapter (and optimizer group) name")
    r: int = opt(8, "LoRA rank", min=1)
    lora_alpha: int = opt(32, "LoRA scaling alpha", min=1)
    lora_dropout: float = opt(0.05, "dropout on the LoRA input", min=0.0, max=1.0)
    target_modules: str | list[str] = opt(
        "all-linear", "'all-linear', module names (comma-separated or repeated), or one regex")
    modules_to_save: list[str] | None = opt(None, "extra modules trained in full and saved with the adapter")


@dataclass
class DatasetArgs(Config):
    """The training data."""

    dataset_id: str = opt("twinkle://self-cognition", "dataset id or path (hub id, local file, twinkle:// embedded)")
    subset_name: str | None = opt(None, "dataset subset / config name")
    split: str = opt("train", "dataset split")
    num_proc: int = opt(1, "processes for map/encode", min=1)


@dataclass
class TemplateArgs(Config):
    """How conversations become token ids.

    ``truncation_strategy`` defaults to ``delete``: a training run drops the few over-long rows
    (the count is logged) instead of failing on them (``raise``) or training on cut labels.
    """

    template_cls: str = opt("Template", "registered template name (Template = the tokenizer's own chat template)")
    max_length: int = opt(512, "maximum tokens per row", min=1)
    truncation_strategy: str = opt("delete", "what to do with rows over max_length", choices=TRUNCATION_STRATEGIES)


@dataclass
class TrainingArgs(Config):
    """Loop sizes, intervals, output and resume."""

    batch_size: int = opt(4, "rows per micro-batch", min=1)
    gradient_accumulation_steps: int = opt(1, "micro-batches per optimizer step", min=1)
    train_samples: int | None = opt(None, "training rows to use; none = the script's default", min=1)
    eval_samples: int | None = opt(None, "evaluation rows to use; none = the script's default", min=1)
    eval_interval: int | None = opt(None, "evaluate every N optimizer steps; none = the script's default", min=1)
    log_interval: int = opt(10, "log metrics every N optimizer steps", min=1)
    output_dir: str = opt("output", "where checkpoints are written")
    resume_from_checkpoint: str | None = opt(None, "checkpoint directory to resume from")
    resume_only_model: bool = opt(False, "resume the weights only (fresh optimizer and scheduler)")
    ignore_data_skip: bool = opt(False, "on resume, restart the data from the beginning")
    seed: int = opt(42, "random seed", min=0)


@dataclass
class OptimizerArgs(Config):
    """The optimizer (a registered name or torch.optim class name)."""

    optimizer_cls: str = opt("AdamW", "optimizer class name")
    learning_rate: float = opt(1e-4, "peak learning rate", min=0.0, aliases=("lr",))
    weight_decay: float = opt(0.01, "weight decay", min=0.0)
    max_grad_norm: float | None = opt(1.0, "gradient clipping norm; none = no clipping", min=0.0)


@dataclass
class SchedulerArgs(Config):
    """The learning-rate schedule (counted in optimizer steps)."""

    scheduler_cls: str = opt("CosineWarmupScheduler", "registered scheduler name")
    num_warmup_steps: int = opt(0, "linear warm-up steps", min=0)
    min_lr_ratio: float = opt(0.0, "final lr as a fraction of the peak", min=0.0, max=1.0)
