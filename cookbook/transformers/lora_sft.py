"""LoRA SFT with TransformersModel: dataset -> template -> DataLoader -> LoRA -> Muon -> loop -> eval -> save.

With no arguments it trains twinkle's embedded tiny Qwen-style model (random init, embedded
tokenizer) on the embedded self-cognition data, on CPU, in well under a minute:

    python cookbook/transformers/lora_sft.py

Point it at real ones with one argument each, e.g.
``--model-id ms://Qwen/Qwen3-0.6B --template Qwen3Template --dataset-id ms://swift/self-cognition``.
Resume with ``--resume-from-checkpoint output/lora_sft/last-checkpoint``.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from peft import LoraConfig
from torch.optim import Muon
from tqdm import tqdm

import twinkle
from twinkle import get_logger, known_warnings
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor

logger = get_logger()
TINY_MODEL = "twinkle://tiny-qwen"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-id", default=TINY_MODEL, help="ms://, hf://, twinkle:// or a local path")
    p.add_argument("--dataset-id", default="twinkle://self-cognition", help="self-cognition style dataset id/path")
    p.add_argument("--template", default="Template", help="registered template name (Template = tokenizer's own)")
    p.add_argument("--max-length", type=int, default=256)
    p.add_argument("--model-name", default="twinkle大模型")
    p.add_argument("--model-author", default="ModelScope社区")
    p.add_argument("--train-samples", type=int, default=512)
    p.add_argument("--eval-samples", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help="global batch size")
    p.add_argument("--gradient-accumulation-steps", type=int, default=1)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=2e-2)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--scheduler", default="CosineWarmupScheduler")
    p.add_argument("--warmup-steps", type=int, default=5)
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument("--target-modules", default=None,
                   help="comma-separated LoRA targets, or all-linear (default; the tiny random default model also "
                        "adapts lm_head so it can learn visibly in a minute)")
    p.add_argument("--modules-to-save", default="", help="comma-separated modules trained in full next to LoRA")
    p.add_argument("--adapter-name", default="default")
    p.add_argument("--mixed-precision", default="no", choices=["no", "bf16", "fp16", "fp8"],
                   help="'no' is fastest for the tiny model on CPU; use bf16 on GPUs")
    p.add_argument("--log-interval", type=int, default=10)
    p.add_argument("--eval-interval", type=int, default=40)
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps")
    p.add_argument("--output-dir", default="output/lora_sft")
    p.add_argument("--resume-from-checkpoint", default=None)
    p.add_argument("--resume-only-model", action="store_true")
    p.add_argument("--ignore-data-skip", action="store_true")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args(argv)


def lora_targets(args: argparse.Namespace) -> str | list[str]:
    if args.target_modules is None and args.model_id == TINY_MODEL:
        # random init: its frozen output head gives nearly uniform logits, so let LoRA adapt it too
        return ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    if args.target_modules in (None, "all-linear"):
        return "all-linear"
    return args.target_modules.split(",")


def build_dataset(args: argparse.Namespace, rows: range) -> Dataset:
    dataset = Dataset(dataset_meta=DatasetMeta(args.dataset_id, data_slice=rows))
    dataset.set_template(args.template, model_id=args.model_id, max_length=args.max_length,
                         truncation_strategy="delete")
    dataset.map(SelfCognitionProcessor(args.model_name, args.model_author))
    dataset.encode()
    return dataset


def evaluate(model: TransformersModel, dataset: Dataset, args: argparse.Namespace) -> dict[str, float]:
    for batch in DataLoader(dataset, batch_size=args.batch_size, shuffle=False, min_batch_size=1):
        model.forward_only(inputs=batch, adapter_name=args.adapter_name)
        model.calculate_loss(adapter_name=args.adapter_name)
    return model.calculate_metric(is_training=False, adapter_name=args.adapter_name)


def save_checkpoint(model: TransformersModel, name: str, loader: DataLoader, args: argparse.Namespace) -> str:
    return model.save(name, output_dir=args.output_dir, adapter_name=args.adapter_name, save_optimizer=True,
                      consumed_train_samples=loader.get_state()["consumed_train_samples"])


def train(args: argparse.Namespace) -> str:
    known_warnings.silence(args.model_id)  # dependencies' notes that do not apply here (see the module)
    twinkle.initialize(mode="local", seed=args.seed)
    train_set = build_dataset(args, range(args.train_samples))
    eval_set = build_dataset(args, range(args.train_samples, args.train_samples + args.eval_samples))
    loader = DataLoader(train_set, batch_size=args.batch_size)
    steps_per_epoch = len(loader) // args.gradient_accumulation_steps
    total_steps = steps_per_epoch * args.epochs
    if args.max_steps is not None:
        total_steps = min(total_steps, args.max_steps)

    model = TransformersModel(model_id=args.model_id, mixed_precision=args.mixed_precision)
    targets = lora_targets(args)
    to_save = [m for m in args.modules_to_save.split(",") if m] or None
    model.add_adapter_to_model(args.adapter_name, LoraConfig(r=args.lora_r, lora_alpha=args.lora_alpha,
                                                             target_modules=targets, modules_to_save=to_save),
                               gradient_accumulation_steps=args.gradient_accumulation_steps)
    # Muon takes the LoRA matrices; anything else trainable (the norm above) goes to an AdamW partner.
    model.set_optimizer(optimizer_cls=Muon, lr=args.lr, adjust_lr_fn="match_rms_adamw",
                        adapter_name=args.adapter_name)
    model.set_lr_scheduler(scheduler_cls=args.scheduler, num_warmup_steps=min(args.warmup_steps, total_steps),
                           num_training_steps=total_steps, adapter_name=args.adapter_name)
    if args.resume_from_checkpoint:
        progress = model.resume_from_checkpoint(str(Path(args.resume_from_checkpoint).expanduser().resolve()),
                                                resume_only_model=args.resume_only_model,
                                                adapter_name=args.adapter_name)
        if not args.ignore_data_skip:
            loader.resume_from_checkpoint(progress["consumed_train_samples"])
        logger.info("resumed at step %d (%d samples consumed)", progress["cur_step"],
                    progress["consumed_train_samples"])
    logger.info(model.get_train_configs())

    group = model.optimizer_group[args.adapter_name]
    best_loss = math.inf
    bar = tqdm(total=total_steps, initial=group.cur_step, desc="lora_sft", dynamic_ncols=True)
    while group.cur_step < total_steps:
        for batch in loader:
            model.forward_backward(inputs=batch, adapter_name=args.adapter_name)
            model.clip_grad_and_step(max_grad_norm=args.max_grad_norm, adapter_name=args.adapter_name)
            if group.micro_step:  # inside an accumulation window
                continue
            metric = model.calculate_metric(is_training=True, adapter_name=args.adapter_name)
            bar.update(1)
            bar.set_postfix(loss=f"{metric['loss']:.3f}", lr=f"{metric['lr']:.2e}",
                            tok_s=f"{metric.get('tokens_per_second', 0.0):.0f}")
            step = group.cur_step
            if step % args.log_interval == 0:
                logger.info("step %d/%d %s", step, total_steps, {k: round(v, 4) for k, v in metric.items()})
            if step % args.eval_interval == 0:
                metrics = evaluate(model, eval_set, args)
                logger.info("eval at step %d: %s", step, metrics)
                if metrics["loss"] < best_loss:
                    best_loss = metrics["loss"]
                    save_checkpoint(model, "best-checkpoint", loader, args)
            if step >= total_steps:
                break
    bar.close()
    metrics = evaluate(model, eval_set, args)
    logger.info("final eval: %s", metrics)
    if metrics["loss"] < best_loss:
        save_checkpoint(model, "best-checkpoint", loader, args)
    path = save_checkpoint(model, "last-checkpoint", loader, args)
    print(f"final checkpoint: {Path(path).resolve()}")
    return path


if __name__ == "__main__":
    train(parse_args())
