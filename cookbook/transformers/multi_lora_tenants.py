"""Multi-tenant LoRA on one shared base: acquire slots -> own optimizer/scheduler -> train -> save -> release.

Several tenants borrow LoRA slots of one ``MultiLoraTransformersModel`` (the base weights load once),
each with its own LoraConfig (rank, alpha, target layers), optimizer and lr scheduler. They train
time-shared (one tenant per call) and in batched steps (``forward_backward_multi``: one
forward/backward over every tenant's rows, each through its own LoRA), save standard PEFT adapters
and give their slots back. With no arguments it runs on CPU with twinkle's embedded tiny model and
self-cognition data in seconds:

    python cookbook/transformers/multi_lora_tenants.py --steps 4

Each adapter loads with ``PeftModel.from_pretrained(base, path)``; see docs/multi_lora.md.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
from peft import LoraConfig

import twinkle
from twinkle import get_logger, known_warnings
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import MultiLoraTransformersModel
from twinkle.preprocessor import SelfCognitionProcessor

logger = get_logger()


@dataclass(frozen=True)
class TenantSpec:
    """One tenant: its adapter config and training hyper-parameters."""

    name: str
    lora: LoraConfig
    optimizer: str
    lr: float
    scheduler: str


def tenant_specs() -> list[TenantSpec]:
    """Three tenants with different ranks, scalings, target layers, optimizers and schedules."""
    return [
        TenantSpec("tenant_a", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
                   "AdamW", 2e-2, "CosineWarmupScheduler"),
        TenantSpec("tenant_b", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"),
                   "Adam", 1e-2, "LinearWarmupScheduler"),
        TenantSpec("tenant_c", LoraConfig(r=16, lora_alpha=16, use_rslora=True,
                                          target_modules=["gate_proj", "up_proj", "down_proj"]),
                   "AdamW", 5e-3, "CosineWarmupScheduler"),
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-id", default="twinkle://tiny-qwen", help="ms://, hf://, twinkle:// or a local path")
    p.add_argument("--dataset-id", default="twinkle://self-cognition")
    p.add_argument("--template", default="Template", help="registered template name (Template = tokenizer's own)")
    p.add_argument("--mixed-precision", default="no", choices=["no", "bf16", "fp16"],
                   help="'no' (fp32) for CPU; bf16 on GPUs")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--train-samples", type=int, default=48)
    p.add_argument("--batch-size", type=int, default=4, help="rows per tenant per step")
    p.add_argument("--steps", type=int, default=6,
                   help="optimizer steps per tenant; odd steps are time-shared, even steps batched")
    p.add_argument("--max-loras", type=int, default=4)
    p.add_argument("--max-r", type=int, default=16)
    p.add_argument("--output-dir", default="output/multi_lora_tenants")
    p.add_argument("--seed", type=int, default=42)
    return p.parse_args(argv)


def build_loader(args: argparse.Namespace, rows: range, author: str) -> DataLoader:
    """A self-cognition loader for one tenant (each tenant teaches its own author name)."""
    dataset = Dataset(dataset_meta=DatasetMeta(args.dataset_id, data_slice=rows))
    dataset.set_template(args.template, model_id=args.model_id, max_length=args.max_length,
                         truncation_strategy="delete")
    dataset.map(SelfCognitionProcessor("twinkle大模型", author))
    dataset.encode()
    return DataLoader(dataset, batch_size=args.batch_size)


def batches(loader: DataLoader):
    """Batches of ``loader`` forever (epoch after epoch)."""
    while True:
        yield from loader


def stackable(rows: list[dict]) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask``/``labels``: the keys ``forward_backward_multi`` stacks.

    (Unpacked rows, so position ids are the default 0..n-1; padding is masked and has label -100.)
    """
    width = max(len(row["input_ids"]) for row in rows)
    input_ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention_mask = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, row in enumerate(rows):
        n = len(row["input_ids"])
        input_ids[i, :n] = torch.as_tensor(row["input_ids"])
        attention_mask[i, :n] = 1
        labels[i, :n] = torch.as_tensor(row["labels"])
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def run(args: argparse.Namespace) -> dict[str, tuple[list[float], str]]:
    """Train every tenant; returns ``{tenant: (losses per step, adapter path)}``."""
    known_warnings.silence(args.model_id)  # dependencies' notes that do not apply here (see the module)
    twinkle.initialize(mode="local", seed=args.seed)
    specs = tenant_specs()
    model = MultiLoraTransformersModel(model_id=args.model_id, mixed_precision=args.mixed_precision,
                                       max_loras=args.max_loras, max_r=args.max_r, max_length=args.max_length)
    per_tenant = args.train_samples // len(specs)
    data = {s.name: batches(build_loader(args, range(i * per_tenant, (i + 1) * per_tenant), f"{s.name} lab"))
            for i, s in enumerate(specs)}
    for spec in specs:
        slot = model.multi_lora.acquire_lora(spec.name, spec.lora)
        model.set_optimizer(spec.optimizer, lr=spec.lr, adapter_name=spec.name)
        model.set_lr_scheduler(spec.scheduler, num_warmup_steps=1, num_training_steps=args.steps,
                               adapter_name=spec.name)
        logger.info("%s acquired %s (r=%d, alpha=%d)", spec.name, slot, spec.lora.r, spec.lora.lora_alpha)

    losses: dict[str, list[float]] = {s.name: [] for s in specs}
    for step in range(1, args.steps + 1):
        if step % 2:  # time-shared: tenants take turns on the shared base, call by call
            for spec in specs:
                model.forward_backward(inputs=next(data[spec.name]), adapter_name=spec.name)
                model.clip_grad_and_step(max_grad_norm=1.0, adapter_name=spec.name)
                losses[spec.name].append(model.calculate_metric(is_training=True, adapter_name=spec.name)["loss"])
        else:  # batched: one forward/backward over every tenant's rows
            step_losses = model.forward_backward_multi({s.name: stackable(next(data[s.name])) for s in specs})
            for spec in specs:
                model.clip_grad_and_step(max_grad_norm=1.0, adapter_name=spec.name)
                model.calculate_metric(is_training=True, adapter_name=spec.name)  # reset the window's metric
                losses[spec.name].append(float(step_losses[spec.name]))
        logger.info("step %d/%d %s", step, args.steps, {t: round(v[-1], 4) for t, v in losses.items()})

    results: dict[str, tuple[list[float], str]] = {}
    for spec in specs:
        path = model.save(f"{spec.name}-final", args.output_dir, adapter_name=spec.name)
        model.multi_lora.release_lora(spec.name)
        results[spec.name] = (losses[spec.name], str(Path(path).resolve()))
    return results


def main(argv: list[str] | None = None) -> None:
    results = run(parse_args(argv))
    for tenant, (losses, path) in results.items():
        print(f"{tenant}: losses {' '.join(f'{x:.4f}' for x in losses)}")
        print(f"{tenant}: adapter {path}")


if __name__ == "__main__":
    main()
