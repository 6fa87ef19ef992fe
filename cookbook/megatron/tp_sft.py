"""LoRA SFT with MegatronModel and tensor parallelism (the flow of docs/megatron.md).

On GPUs, one process per rank:

    torchrun --nproc_per_node=4 cookbook/megatron/tp_sft.py --tp-size 2 --dp-size 2 \\
        --model-id ms://Qwen/Qwen2.5-7B-Instruct --mixed-precision bf16

``--tiny-cpu`` runs the same flow on CPU with tp=1 on twinkle's embedded tiny model and data, in
seconds (what the tests run). The parallel layout comes only from the DeviceMesh.
"""

from __future__ import annotations

import argparse

from peft import LoraConfig

import twinkle
from twinkle import DeviceMesh, get_logger, known_warnings
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import MegatronModel
from twinkle.preprocessor import SelfCognitionProcessor

logger = get_logger()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny-cpu", action="store_true", help="tiny embedded model and data, CPU, tp=1")
    p.add_argument("--model-id", default="twinkle://tiny-qwen")
    p.add_argument("--dataset-id", default="twinkle://self-cognition")
    p.add_argument("--template", default="Template")
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--pp-size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--mixed-precision", default="bf16", choices=["no", "bf16", "fp16", "fp8"])
    p.add_argument("--train-samples", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=16, help="global batch size")
    p.add_argument("--gradient-accumulation-steps", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--output-dir", default="output/megatron_tp_sft")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    if args.tiny_cpu:
        args.tp_size = args.pp_size = args.dp_size = 1
        args.mixed_precision = "no"
        args.model_id = "twinkle://tiny-qwen"
        args.lr = max(args.lr, 1e-2)  # a random-init tiny model learns visibly in a few steps
    return args


def train(args: argparse.Namespace) -> str:
    known_warnings.silence(args.model_id)  # dependencies' notes that do not apply here (see the module)
    mesh = DeviceMesh.from_sizes(dp_size=args.dp_size, tp_size=args.tp_size, pp_size=args.pp_size)
    twinkle.initialize(global_device_mesh=mesh, seed=args.seed)
    dataset = Dataset(dataset_meta=DatasetMeta(args.dataset_id, data_slice=range(args.train_samples)))
    dataset.set_template(args.template, model_id=args.model_id, max_length=256, truncation_strategy="delete")
    dataset.map(SelfCognitionProcessor("twinkle大模型", "ModelScope社区"))
    dataset.encode()
    loader = DataLoader(dataset, batch_size=args.batch_size // args.gradient_accumulation_steps, device_mesh=mesh)
    total = len(loader) // args.gradient_accumulation_steps
    if args.max_steps is not None:
        total = min(total, args.max_steps)

    model = MegatronModel(model_id=args.model_id, device_mesh=mesh, mixed_precision=args.mixed_precision)
    model.add_adapter_to_model("sft", LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    model.set_optimizer("default", lr=args.lr, adapter_name="sft")  # MegatronDistributedOptimizer
    model.set_lr_scheduler("default", lr_warmup_steps=min(args.warmup_steps, total - 1), lr_decay_steps=total,
                           lr_decay_style="cosine", adapter_name="sft")  # OptimizerParamScheduler
    group = model.optimizer_group["sft"]
    for batch in loader:
        model.forward_backward(inputs=batch, adapter_name="sft")
        model.clip_grad_and_step(1.0, gradient_accumulation_steps=args.gradient_accumulation_steps,
                                 adapter_name="sft")
        if group.micro_step:
            continue
        metric = model.calculate_metric(is_training=True, adapter_name="sft")
        logger.info("step %d/%d loss %.4f", group.cur_step, total, metric["loss"])
        if group.cur_step >= total:
            break
    path = model.save("last-checkpoint", output_dir=args.output_dir, adapter_name="sft", save_optimizer=True,
                      consumed_train_samples=loader.get_state()["consumed_train_samples"])
    print(f"final checkpoint: {path}")
    return path


if __name__ == "__main__":
    train(parse_args())
