"""Full-parameter SFT with the Trainer (every weight trained; no LoRA), the config-driven way.

    python cookbook/transformers/full_sft.py --tiny-cpu          # embedded tiny model + data, CPU, seconds
    python cookbook/transformers/full_sft.py --model-id ms://Qwen/Qwen3-0.6B --template Qwen3Template \\
        --mixed-precision bf16 --total-epoch 1

The same job from the command line: ``twinkle train --lora.no-enabled`` (see docs/trainer.md).
Checkpoints go to ``<work-dir>/checkpoints/step-N`` (model, optimizer, scheduler, RNG, data
position); ``--auto-resume`` continues from the newest complete one; HF-format exports of the full
model go to ``<work-dir>/hf`` every ``--hf-interval`` steps.
"""

from __future__ import annotations

import argparse

from twinkle.cli.train_cmd import progress
from twinkle.trainer import Trainer, TrainerConfig


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny-cpu", action="store_true", help="the embedded tiny model and data, fp32 on CPU")
    p.add_argument("--model-id", default="twinkle://tiny-qwen")
    p.add_argument("--template", default="Template")
    p.add_argument("--dataset-id", default="twinkle://self-cognition")
    p.add_argument("--mixed-precision", default="bf16", choices=["no", "bf16", "fp16", "fp8"])
    p.add_argument("--train-samples", type=int, default=None)
    p.add_argument("--global-batch-size", type=int, default=16)
    p.add_argument("--gradient-accumulation-steps", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--total-epoch", type=int, default=1)
    p.add_argument("--total-step", type=int, default=None, help="overrides --total-epoch")
    p.add_argument("--work-dir", default="output/full_sft")
    p.add_argument("--checkpoint-interval", type=int, default=100)
    p.add_argument("--hf-interval", type=int, default=None)
    p.add_argument("--auto-resume", action="store_true")
    args = p.parse_args(argv)
    if args.tiny_cpu:
        args.model_id, args.mixed_precision, args.template = "twinkle://tiny-qwen", "no", "Template"
        args.lr = max(args.lr, 1e-3)  # random init: a larger step shows learning within seconds
    return args


def build_config(args: argparse.Namespace) -> TrainerConfig:
    """The TrainerConfig of this job; errors name the field before anything is loaded."""
    return TrainerConfig.from_dict({
        "model": {"model_id": args.model_id, "mixed_precision": args.mixed_precision},
        "lora": {"enabled": False},
        "optimizer": {"name": "AdamW", "lr": args.lr, "weight_decay": 0.01},
        "lr": {"scheduler": "CosineWarmupScheduler", "warmup_steps": 2},
        "dataset": {"dataset_id": args.dataset_id, "template": args.template, "train_samples": args.train_samples},
        "dataloader": {"gradient_accumulation_steps": args.gradient_accumulation_steps},
        "global_batch_size": args.global_batch_size,
        "total_step": args.total_step,
        "total_epoch": None if args.total_step else args.total_epoch,
        "work_dir": args.work_dir,
        "checkpoint_interval": args.checkpoint_interval,
        "checkpoint_maxkeep": 2,
        "hf_interval": args.hf_interval,
        "auto_resume": args.auto_resume,
    })


def main(argv: list[str] | None = None) -> str | None:
    config = build_config(parse_args(argv))
    trainer = Trainer(config)
    with progress(trainer, config.progress_bar):  # the bar `twinkle train` shows; log lines print above it
        result = trainer.fit()
    print(f"finished at step {result.step}/{result.total_step}, final loss {result.final_loss:.4f}; "
          f"checkpoint: {result.checkpoint}")
    return result.checkpoint


if __name__ == "__main__":
    main()
