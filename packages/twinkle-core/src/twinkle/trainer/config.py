"""TrainerConfig and its groups: a :mod:`twinkle.config` schema, validated eagerly.

A wrong field name, type or value raises :class:`ConfigError` naming the option (``optimizer.lr``)
when the config is built, before any model or dataset is loaded. Build one in Python, or from a
YAML/TOML file or dict with :meth:`TrainerConfig.from_dict` / :meth:`from_file`. The ``model`` and
``infra`` groups are :mod:`twinkle.launch`'s, shared with ``twinkle serve``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal, TypedDict

from twinkle.config import Config, ConfigError, build, from_mapping, load_file, opt, schema_of
from twinkle.config.schema import norm
from twinkle.constants import TRUNCATION_STRATEGIES
from twinkle.launch import TINY_MODEL, InfraConfig, ModelConfig
from twinkle.trainer.data_checks import check_data_options
from twinkle.trainer.groups import (
    FSDPConfig,
    HooksConfig,
    InternalMetricsConfig,
    LoadCheckpointConfig,
    ResumeConfig,
    forward_groups,
)

TINY_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
#: Intervals and keep-counts: a positive number, or -1 / none to turn them off.
OFF = (-1,)


@dataclass
class LoraConfig(Config):
    """LoRA adapter settings; ``enabled=False`` trains the full model instead."""

    enabled: bool = opt(True, "train a LoRA adapter (false: the full model)")
    adapter_name: str = opt("default", "adapter and optimizer-group name")
    r: int = opt(16, "LoRA rank", min=1)
    alpha: int = opt(32, "LoRA alpha (scaling = alpha / r)", min=1)
    dropout: float = opt(0.0, "dropout on the LoRA input", min=0.0, lt=1.0)
    target_modules: str | list[str] | None = opt(
        None, "layers to adapt: names (a,b,c), one regex or all-linear; none = all-linear (plus lm_head on the "
              "tiny default)")
    modules_to_save: list[str] | None = opt(None, "modules trained in full and saved with the adapter")
    merge_on_export: bool = opt(False, "HF exports hold the merged model instead of the adapter")


@dataclass
class OptimizerConfig(Config):
    """Optimizer by registered name (``AdamW``, ``Muon``...) and its options; xtuner's OptimConfig/AdamWConfig."""

    name: str = opt("AdamW", "registered optimizer (AdamW, Muon, SGD, ...)")
    lr: float = opt(5e-3, "peak learning rate", gt=0.0)
    weight_decay: float = opt(0.0, "weight decay", min=0.0)
    betas: list[float] | None = opt(None, "Adam's (beta1, beta2); none = the optimizer's default")
    eps: float | None = opt(None, "Adam's epsilon; none = the optimizer's default", gt=0.0)
    foreach: bool | None = opt(None, "torch's multi-tensor implementation; none = torch decides")
    max_grad_norm: float = opt(1.0, "gradient clipping norm (see do_clip)", gt=0.0)
    skip_grad_norm_threshold: float | None = opt(
        None, "a window whose gradient norm exceeds this is dropped without a step (like an inf/NaN one)", gt=0.0)
    max_consecutive_skips: int = opt(50, "inf/NaN steps are skipped; this many in a row stop training", min=1)
    kwargs: dict[str, Any] = opt(help="extra optimizer arguments (a table)", factory=dict)

    def check(self) -> None:
        if self.betas is not None and (len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas)):
            raise ConfigError(f"betas: {self.betas!r}; expected two numbers in [0, 1), e.g. 0.9,0.95.")
        # a kwargs key that is also a set field (lr and weight_decay always are: they have defaults) would silently
        # replace it (``lr`` in kwargs beat ``optimizer.lr``); one of an unset optional field (eps) replaces nothing
        set_fields = [f for f in fields(self) if f.name != "kwargs" and getattr(self, f.name) is not None]
        fields_ = {norm(spelling): f.name for f in set_fields for spelling in (f.name, *f.metadata.get("aliases", ()))}
        clash = [(key, fields_[norm(str(key))]) for key in self.kwargs if norm(str(key)) in fields_]
        if clash:
            both = "; ".join(f"kwargs.{key} and {name}" for key, name in clash)
            raise ConfigError(f"kwargs: {both} set the same optimizer argument; give it once, as optimizer."
                              f"{clash[0][1]} (kwargs is for arguments the group has no field for, e.g. momentum).",
                              option="optimizer.kwargs", value=clash[0][0])

    def optimizer_kwargs(self) -> dict[str, Any]:
        """What the optimizer is constructed with (lr, weight_decay, the set ones of betas/eps/foreach, kwargs)."""
        named = (("betas", self.betas), ("eps", self.eps), ("foreach", self.foreach))
        extra = {k: v for k, v in named if v is not None}
        if "betas" in extra:
            extra["betas"] = tuple(extra["betas"])
        return {"lr": self.lr, "weight_decay": self.weight_decay, **extra, **self.kwargs}


#: xtuner's name of the optimizer group
OptimConfig = OptimizerConfig


@dataclass
class AdamWConfig(OptimizerConfig):
    """xtuner's AdamWConfig: the optimizer group with xtuner's AdamW defaults (lr 1e-5, weight_decay 0.01,
    betas (0.9, 0.95), eps 1e-8)."""

    lr: float = opt(1e-5, "peak learning rate", gt=0.0)
    weight_decay: float = opt(0.01, "weight decay", min=0.0)
    betas: list[float] | None = opt(help="Adam's (beta1, beta2)", factory=lambda: [0.9, 0.95])
    eps: float | None = opt(1e-8, "Adam's epsilon", gt=0.0)


#: xtuner's lr_type -> twinkle's scheduler
LR_TYPES = {"cosine": "CosineWarmupScheduler", "linear": "LinearWarmupScheduler", "constant": None}
DEFAULT_SCHEDULER = "CosineWarmupScheduler"


@dataclass
class LRConfig(Config):
    """lr schedule: a registered scheduler (``num_training_steps`` from total_step), or xtuner's spelling
    ``lr_type`` (cosine | linear | constant) + ``warmup_ratio`` + ``lr_min``."""

    scheduler: str | None = opt(DEFAULT_SCHEDULER, "registered lr scheduler; none = constant lr")
    warmup_steps: int = opt(0, "linear warm-up steps", min=0)
    kwargs: dict[str, Any] = opt(help="extra scheduler arguments (a table)", factory=dict)
    lr_type: Literal["cosine", "linear", "constant"] | None = opt(
        None, "xtuner's schedule after the warm-up (replaces scheduler): cosine or linear decay to lr_min, or constant")
    warmup_ratio: float | None = opt(
        None, "warm-up as a fraction of the steps (< 1) or a step count (>= 1); replaces warmup_steps (with "
              "lr_type: 0.03 when unset)", min=0.0)
    lr_min: float | None = opt(None, "the lr the decay ends at (with lr_type: 1e-6 when unset)", min=0.0)

    def check(self) -> None:
        if self.lr_type is not None and self.scheduler not in (DEFAULT_SCHEDULER, LR_TYPES[self.lr_type]):
            raise ConfigError(f"lr_type: {self.lr_type!r} chooses the schedule, but scheduler is also set to "
                              f"{self.scheduler!r}; set one of them.")
        if self.warmup_ratio is not None and self.warmup_steps:
            raise ConfigError("warmup_ratio / warmup_steps: both set; set one of them.")

    def schedule(self, lr: float, total_step: int) -> tuple[str | None, dict[str, Any]]:
        """``(scheduler name or None for a constant lr, its keyword arguments)`` for a run of ``total_step``."""
        ratio = self.warmup_ratio if self.warmup_ratio is not None else (0.03 if self.lr_type else None)
        warmup = self.warmup_steps if ratio is None else int(ratio * total_step) if ratio < 1 else int(ratio)
        warmup = min(warmup, total_step)
        name = LR_TYPES[self.lr_type] if self.lr_type is not None else self.scheduler
        if name is None:
            return None, ({"num_warmup_steps": warmup} if warmup else {})
        kwargs: dict[str, Any] = {}
        if name.endswith("WarmupScheduler"):  # twinkle's own: told the schedule's length
            kwargs = {"num_warmup_steps": warmup, "num_training_steps": total_step}
            lr_min = self.lr_min if self.lr_min is not None else (1e-6 if self.lr_type else None)
            if lr_min is not None:
                kwargs["min_lr_ratio"] = lr_min / lr
        return name, {**kwargs, **self.kwargs}


class DatasetCombine(TypedDict, total=False):
    """One source of ``dataset_cfg=[...]`` (xtuner's DatasetCombine): its DatasetConfig, and optionally a
    tokenize_fn (TokenizeFnConfig: template, max_length) that every source shares."""

    dataset: Any
    tokenize_fn: Any


@dataclass
class TokenizeFnConfig(Config):
    """How the sources of ``dataset_cfg`` are encoded (xtuner's tokenize_fn); unset fields: the dataset group's."""

    template: str | None = opt(None, "registered chat template")
    max_length: int | None = opt(None, "tokens per row at most", min=1)
    truncation_strategy: str | None = opt(None, "rows over max_length", choices=TRUNCATION_STRATEGIES)


@dataclass
class DatasetConfig(Config):
    """Training (and evaluation) data: a dataset id, its template and preprocessor; ``dataset_cfg=[...]`` (a list
    of DatasetCombine) trains on several sources, each taken ``sample_ratio`` times."""

    LIST_FIELD = "combine"

    dataset_id: str | Path = opt("twinkle://self-cognition", "training data: hub id, local file or twinkle:// "
                                 "embedded data (anno_path: xtuner's name)", aliases=("anno_path",))
    template: str = opt("Template", "registered chat template (Template = the tokenizer's own)")
    max_length: int = opt(256, "tokens per row at most", min=1)
    truncation_strategy: str = opt("delete", "rows over max_length", choices=TRUNCATION_STRATEGIES)
    preprocessor: str | None = opt("SelfCognitionProcessor",
                                   "registered preprocessor turning rows into messages; none = rows are messages")
    preprocessor_kwargs: dict[str, Any] = opt(help="preprocessor arguments (a table)", factory=lambda: {
        "model_name": "twinkle大模型", "model_author": "ModelScope社区", "system": None})
    train_samples: int | None = opt(None, "training rows to use; none = all (minus the eval rows)", min=1)
    eval_samples: int = opt(0, "rows after the training rows held out for evaluation", min=0)
    eval_dataset_id: str | None = opt(None, "a separate evaluation dataset")
    name: str | None = opt(None, "a name for this source in logs")
    sample_ratio: float = opt(1.0, "rows taken = int(rows * ratio): whole repeats, then a seeded sample of the rest",
                              gt=0.0)
    enable_sequential_sampler: bool = opt(False, "the sampled rest of sample_ratio is the first rows, not a random "
                                                 "sample")
    combine: Any = opt(None, "several sources (a list of DatasetCombine; dataset_cfg=[...] sets it)")
    streaming: bool = opt(False, "read the training rows as a stream, mapped and encoded as they are needed (never "
                                 "all in memory); needs total_step")
    packing: bool = opt(False, "bin-pack the encoded training rows into packs of up to dataloader.pack_max_length "
                               "tokens (default: max_length); a batch then counts packs")
    packing_interval: int = opt(128, "streaming + packing: rows read into each packing buffer", min=1)

    def check(self) -> None:
        if self.combine is None:
            return
        if not isinstance(self.combine, (list, tuple)) or not self.combine:
            raise ConfigError(f"combine: expected a non-empty list of {{'dataset': DatasetConfig(...), "
                              f"'tokenize_fn': ...}}, got {self.combine!r}.")
        self.combine = [_source(i, entry) for i, entry in enumerate(self.combine)]
        shared = {(c["tokenize_fn"].template, c["tokenize_fn"].max_length, c["tokenize_fn"].truncation_strategy)
                  for c in self.combine}
        if len(shared) > 1:
            raise ConfigError("combine: the sources' tokenize_fn differ; every source is encoded with one template "
                              "and max_length: give them the same tokenize_fn.")

    def sources(self) -> list[DatasetConfig]:
        """The training sources: this group, or the ``combine`` list's datasets."""
        return [c["dataset"] for c in self.combine] if self.combine else [self]

    def encoding(self) -> tuple[str, int, str]:
        """``(template, max_length, truncation_strategy)``: the sources' shared tokenize_fn over this group's."""
        fn = self.combine[0]["tokenize_fn"] if self.combine else TokenizeFnConfig()
        return (fn.template or self.template, fn.max_length or self.max_length,
                fn.truncation_strategy or self.truncation_strategy)


def _source(index: int, entry: Any) -> dict[str, Any]:
    where = f"combine[{index}]"
    if isinstance(entry, DatasetConfig):
        entry = {"dataset": entry}
    if not isinstance(entry, Mapping) or "dataset" not in entry or set(entry) - {"dataset", "tokenize_fn"}:
        raise ConfigError(f"{where}: expected {{'dataset': DatasetConfig(...), 'tokenize_fn': ...}}, got {entry!r}.")
    try:
        dataset = entry["dataset"]
        dataset = dataset if isinstance(dataset, DatasetConfig) else DatasetConfig(**dict(dataset))
        fn = entry.get("tokenize_fn")
        fn = fn if isinstance(fn, TokenizeFnConfig) else TokenizeFnConfig(**dict(fn or {}))
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if dataset.combine is not None:
        raise ConfigError(f"{where}.dataset: a source cannot combine sources itself.")
    return {"dataset": dataset, "tokenize_fn": fn}


@dataclass
class DataloaderConfig(Config):
    """How a global batch is split: micro-batches of ``global_batch_size / gradient_accumulation_steps`` rows
    (over all data-parallel ranks), or per-rank ``micro_batch_size`` with the accumulation derived from the mesh."""

    gradient_accumulation_steps: int = opt(1, "micro-batches per optimizer step", min=1)
    micro_batch_size: int | None = opt(
        None, "rows per data-parallel rank in one forward; the accumulation is then global_batch_size / "
              "(micro_batch_size x data-parallel size)", min=1)
    shuffle: bool = opt(True, "shuffle the rows (seeded, resumable)")
    pack_to_max_length: bool = opt(False, "pack each micro-batch's rows into one row (padding-free; needs an "
                                          "attention that separates sequences)")
    dataset_config_list: Any = opt(None, "xtuner's place for dataset_cfg's list (= dataset.combine)")
    pack_max_length: int | None = opt(None, "tokens per pack (xtuner's); setting it packs the rows, as "
                                            "dataset.packing does", min=1)
    shuffle_buffer: int | None = opt(None, "dataset.streaming: rows in the seeded shuffle buffer (none: 1000; 0: "
                                           "the stream's order)", min=0)


@dataclass
class LossConfig(Config):
    """Loss by registered name (None: the model's default) and its options; ``task`` selects the forward.
    xtuner's CELossConfig: ``mode`` (eager | chunk | liger), ``loss_reduction`` (token | sample | square),
    ``chunk_size``, ``ignore_idx``."""

    name: str | None = opt(None, "registered loss; none = the model's default (cross-entropy)")
    task: str = opt("causal_lm", "forward flavour: causal_lm | fused_lm_ce | embedding")
    kwargs: dict[str, Any] = opt(help="loss arguments (a table)", factory=dict)
    mode: Literal["eager", "chunk", "liger"] | None = opt(
        None, "cross-entropy: eager (full logits), chunk (fused linear+CE in torch chunks, no full logits), liger "
              "(liger-kernel's fused linear+CE on GPU)")
    loss_reduction: Literal["token", "sample", "square"] = opt(
        "token", "how tokens are weighted: token (each the same), sample (each sample the same), square "
                 "(1/sqrt(sample tokens))")
    chunk_size: int | None = opt(None, "mode chunk: positions per chunk", min=1)
    ignore_idx: int = opt(-100, "label value that is not trained")

    def check(self) -> None:
        customised = self.mode not in (None, "eager") or self.loss_reduction != "token" or self.ignore_idx != -100
        if customised and self.name is not None:
            raise ConfigError(f"name: {self.name!r} and the cross-entropy options (mode, loss_reduction, ignore_idx) "
                              "both choose the loss; set one of them.")
        if self.mode in ("chunk", "liger") and self.loss_reduction != "token":
            raise ConfigError(f"loss_reduction: {self.loss_reduction!r} needs mode eager (the fused losses weight "
                              "every token the same).")
        if self.chunk_size is not None and self.mode != "chunk":
            raise ConfigError("chunk_size: only used with mode chunk.")

    def resolved(self) -> tuple[str | None, dict[str, Any], str]:
        """``(registered loss or None for the model's default, its arguments, the forward task)``."""
        if self.mode in ("chunk", "liger"):
            kwargs: dict[str, Any] = {"ignore_index": self.ignore_idx}
            if self.mode == "chunk":
                kwargs["chain"] = ["torch.fused_linear_cross_entropy"]
            if self.chunk_size is not None:
                kwargs["chunk_size"] = self.chunk_size
            return "LigerFusedLinearCrossEntropyLoss", {**kwargs, **self.kwargs}, "fused_lm_ce"
        if self.loss_reduction != "token" or self.ignore_idx != -100:
            kwargs = {"ignore_index": self.ignore_idx, "loss_reduction": self.loss_reduction}
            return "CrossEntropyLoss", {**kwargs, **self.kwargs}, self.task
        return self.name, dict(self.kwargs), self.task


#: xtuner's name of the loss group
CELossConfig = LossConfig
GRAD_NORM_DTYPES = ("float32", "float64")
#: numpy's seeds are 32-bit (torch's 64): a larger seed would pass here and overflow when the run starts
SEED_MAX = 2**32 - 1


@dataclass
class TrainerConfig(Config):
    """Everything :class:`twinkle.trainer.Trainer` needs; see docs/trainer.md for each option.

    One schema, two spellings: every option also has xtuner v1's name (``optim_cfg`` for ``optimizer``,
    ``sp_size`` for ``infra.cp_size``, ``dist_backend`` for ``backend``...), in Python, YAML/TOML and on the
    command line.
    """

    model: ModelConfig = opt(factory=ModelConfig, aliases=("model_cfg",))
    lora: LoraConfig = opt(factory=LoraConfig)
    optimizer: OptimizerConfig = opt(factory=OptimizerConfig, aliases=("optim_cfg",))
    lr: LRConfig = opt(factory=LRConfig, aliases=("lr_cfg",))
    dataset: DatasetConfig = opt(factory=DatasetConfig, aliases=("dataset_cfg",))
    dataloader: DataloaderConfig = opt(factory=DataloaderConfig, aliases=("dataloader_cfg",))
    loss: LossConfig = opt(factory=LossConfig, aliases=("loss_cfg",))
    infra: InfraConfig = opt(factory=InfraConfig)
    fsdp: FSDPConfig = opt(factory=FSDPConfig, aliases=("fsdp_cfg",))
    resume: ResumeConfig = opt(factory=ResumeConfig, aliases=("resume_cfg",))
    load_checkpoint: LoadCheckpointConfig = opt(factory=LoadCheckpointConfig, aliases=("load_checkpoint_cfg",))
    hooks: HooksConfig = opt(factory=HooksConfig, aliases=("hooks_config",))
    internal_metrics: InternalMetricsConfig = opt(factory=InternalMetricsConfig, aliases=("internal_metrics_cfg",))
    load_from: str | Path | None = opt(
        None, "start from these weights: an HF model directory or a twinkle train checkpoint")
    global_batch_size: int | None = opt(8, "rows per optimizer step over all data-parallel ranks; none = one row "
                                           "per data-parallel rank and intra-layer micro-batch", min=1)
    total_step: int | None = opt(None, "optimizer steps to train (replaces total_epoch)", min=1)
    total_epoch: int | None = opt(None, "passes over the data (replaces total_step)", min=1)
    work_dir: str | Path | None = opt("work_dir", "where checkpoints, logs and exports go (none: ./work_dir)")
    overwrite: bool = opt(False, "start a new run in a work_dir that holds another run's checkpoints, deleting them "
                                 "(its logs are kept)")
    checkpoint_interval: int | None = opt(-1, "resumable checkpoint every N steps (-1: only at the end)", min=1,
                                          also=OFF)
    checkpoint_maxkeep: int | None = opt(-1, "checkpoints kept (-1: all)", min=1, also=OFF)
    auto_resume: bool = opt(False, "continue from the newest complete checkpoint (or snapshot) in work_dir")
    hf_interval: int | None = opt(None, "HF-format export every N steps", min=1, also=OFF)
    hf_max_keep: int | None = opt(None, "HF exports kept", min=1, also=OFF)
    async_hf_export: bool = opt(False, "write HF exports in the background (renamed into place when complete)")
    exp_tracker: Literal["jsonl", "tensorboard"] = opt("jsonl", "where metrics go")
    log_interval: int = opt(1, "write metrics every N steps", min=1)
    eval_interval: int | None = opt(None, "evaluate (and keep the best checkpoint) every N steps", min=1, also=OFF)
    profile_step: list[int] | int | None = opt(None, "steps to profile (torch.profiler trace, memory, probers)", min=1)
    profile_time: bool = opt(True, "a torch.profiler trace of each profile_step")
    profile_memory: bool = opt(False, "a memory snapshot (CUDA) or memory timeline (CPU) of each profile_step")
    seed: int = opt(42, "random seed", min=0, max=SEED_MAX)
    progress_bar: bool = opt(True, "show the training progress bar")
    tokenizer_path: str | Path | None = opt(
        None, "tokenizer to encode with and save in checkpoints; none = the model's")
    log_dir: str | Path | None = opt(None, "metrics, train.log and profiles; none = work_dir/logs")
    strict_load: bool = opt(True, "weights that do not fit the model are an error (false: a warning)")
    do_clip: bool = opt(True, "clip gradients to optimizer.max_grad_norm (false: only report the norm)")
    grad_norm_dtype: str = opt("float32", "dtype the gradient norm is computed (and clipping decided) in",
                               choices=GRAD_NORM_DTYPES)
    async_checkpoint: bool = opt(False, "write checkpoints in the background while training goes on")
    snapshot_interval: int | None = opt(
        None, "latest-only resumable snapshot every N steps, between full checkpoints", min=1, also=OFF)
    skip_checkpoint_validation: bool = opt(False, "resume without re-reading every checkpoint byte against its "
                                                  "checksums (sizes are still checked); warns")
    patch_for_dcp_finish: bool = opt(False, "DCP saves broadcast an empty result instead of the global metadata "
                                            "from their finish step (the metadata file is still written)")
    check_health_interval: int | None = opt(
        None, "every N steps (and before each checkpoint) all ranks check weights, gradients and communication",
        min=1, also=OFF)
    intra_layer_micro_batch: int = opt(1, "split each micro-batch into N sub-batches run one after the other: the "
                                          "same gradient, less activation memory", min=1)
    debug: bool = opt(False, "anomaly detection, a warning naming the first module with a non-finite output, debug "
                             "logs (twinkle train: also the traceback of an error)")
    backend: str | None = opt(None, "torch.distributed backend under torchrun (gloo, nccl, cpu:gloo,cuda:nccl...); "
                                    "none = the platform's", aliases=("dist_backend",))
    debug_skip_save: bool = opt(False, "write no checkpoint, snapshot, HF export or best checkpoint")
    prober_list: list[str] = opt(help="registered probers run at the profile_steps (AccProber, TimeProber)",
                                 factory=list)

    def check(self) -> None:
        forward_groups(self, ("fsdp", "resume"))
        if self.dataloader.dataset_config_list is not None:
            if self.dataset.combine is not None:
                raise ConfigError("dataloader.dataset_config_list: dataset_cfg is set too; give the list once.")
            self.dataset = DatasetConfig(**{**_fields(self.dataset), "combine": self.dataloader.dataset_config_list})
            self.dataloader.dataset_config_list = None
        if self.work_dir is None:
            self.work_dir = "work_dir"
        if (self.total_step is None) == (self.total_epoch is None):
            raise ConfigError("total_step / total_epoch: set exactly one of them "
                              f"(got total_step={self.total_step!r}, total_epoch={self.total_epoch!r}).")
        gas = self.dataloader.gradient_accumulation_steps
        if self.global_batch_size is not None and self.dataloader.micro_batch_size is None and \
                self.global_batch_size % gas:
            raise ConfigError(f"global_batch_size: {self.global_batch_size} is not divisible by "
                              f"dataloader.gradient_accumulation_steps={gas}.")
        if self.dataloader.micro_batch_size is not None and gas != 1:
            raise ConfigError("dataloader.micro_batch_size / gradient_accumulation_steps: set one of them (with "
                              "micro_batch_size the accumulation is derived from global_batch_size and the mesh).")
        ray = self.infra.mode == "ray"
        if ray and self.async_checkpoint:
            raise ConfigError("async_checkpoint: not available with infra.mode 'ray' (the model saves in its actors); "
                              "run under torchrun, or set async_checkpoint=false.")
        if ray and self.lora.enabled and self.lora.merge_on_export:
            raise ConfigError("lora.merge_on_export: not available with infra.mode 'ray' (the model lives in the "
                              "actors); export the adapter and merge it afterwards, or run under torchrun.")
        if ray:
            _refuse_in_ray(self)
        if not str(self.work_dir).strip():
            raise ConfigError("work_dir: must be a directory path.")
        if self.eval_interval not in (None, -1) and self.dataset.eval_samples == 0:
            raise ConfigError("eval_interval: evaluation needs dataset.eval_samples > 0.")
        targets = self.lora_targets() if self.lora.enabled else []
        if self.loss.resolved()[2] == "fused_lm_ce" and "lm_head" in targets:
            raise ConfigError("loss: the fused linear+cross-entropy (mode chunk/liger) reads lm_head's weight without "
                              "running lm_head, so a LoRA on lm_head would not train; leave lm_head out of "
                              "lora.target_modules, or use mode eager.")
        if self.loss.loss_reduction != "token" and self.dataloader.pack_to_max_length:
            raise ConfigError("loss.loss_reduction: sample/square weight each row of a padded batch; packed rows "
                              "(dataloader.pack_to_max_length) cannot be told apart: turn one of them off.")
        if self.dataset.combine and self.dataset.eval_samples and not self.dataset.eval_dataset_id:
            raise ConfigError("dataset.eval_samples: with several sources (dataset_cfg) name the evaluation data in "
                              "dataset.eval_dataset_id.")
        check_data_options(self)
    # ------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainerConfig:
        """Build from nested plain data (a parsed YAML/TOML file, keyword options); errors name the field."""
        if not isinstance(data, dict):
            raise ConfigError(f"A trainer config must be a table of fields, got {type(data).__name__}.")
        return build(cls, [from_mapping(schema_of(cls), data)])

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], overrides: dict[str, Any] | None = None) -> TrainerConfig:
        """Read a ``.yaml``/``.yml``/``.toml`` file, apply ``overrides`` (``{'optimizer.lr': '1e-4'}``), validate."""
        schema = schema_of(cls)
        return build(cls, [from_mapping(schema, load_file(path), str(path)), from_mapping(schema, overrides or {})])

    @classmethod
    def layered(cls, base: TrainerConfig | None, options: Mapping[str, Any]) -> TrainerConfig:
        """``base`` with ``options`` (any spelling) replacing its fields; either may be missing."""
        if base is not None and not isinstance(base, TrainerConfig):
            raise ConfigError(f"trainer_cfg: expected a TrainerConfig, got {type(base).__name__}.")
        if not options:
            return base if base is not None else cls.from_dict({})
        if base is None:
            return cls.from_dict(dict(options))
        schema = schema_of(cls)
        return build(cls, [from_mapping(schema, _fields(base)), from_mapping(schema, dict(options))])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def profile_steps(self) -> list[int]:
        return [self.profile_step] if isinstance(self.profile_step, int) else list(self.profile_step or [])

    def lora_targets(self) -> list[str] | str:
        """LoRA targets; the random-init tiny default also adapts lm_head so it visibly learns."""
        if self.lora.target_modules is None:
            return list(TINY_LORA_TARGETS) if self.model.model_id == TINY_MODEL else "all-linear"
        return self.lora.target_modules


def _fields(group: Any) -> dict[str, Any]:
    return {f.name: getattr(group, f.name) for f in fields(group)}


def _refuse_in_ray(config: TrainerConfig) -> None:
    """Options that reach into the model's modules or processes, which live in the Ray actors."""
    checks = (("check_health_interval", config.check_health_interval not in (None, -1)),
              ("internal_metrics.internal_metrics_interval", config.internal_metrics.internal_metrics_interval),
              ("prober_list", config.prober_list), ("debug", config.debug),
              ("grad_norm_dtype", config.grad_norm_dtype != "float32"),
              ("optimizer.skip_grad_norm_threshold", config.optimizer.skip_grad_norm_threshold),
              ("async_hf_export", config.async_hf_export), ("backend", config.backend),
              ("load_checkpoint", not config.load_checkpoint.everything or
               config.load_checkpoint.offload_optimizer_first_step))
    for name, on in checks:
        if on:
            raise ConfigError(f"{name}: not available with infra.mode 'ray' (the model lives in the actors); run "
                              "under torchrun, or leave it unset.")
