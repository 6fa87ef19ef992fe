"""LoRA SFT sharded with FSDP2: the flow of a typical user script, with its options from ``CLI.from_args()``.

One process (CPU, the embedded tiny model and data) or any number under torchrun; the mesh comes
from ``--fsdp-size`` / ``--dp-size`` and twinkle shards each decoder layer with FSDP2:

    python cookbook/transformers/fsdp2.py --mixed-precision no
    torchrun --nproc_per_node 2 cookbook/transformers/fsdp2.py --fsdp-size 2 --mixed-precision no
    torchrun --nproc_per_node 8 cookbook/transformers/fsdp2.py --fsdp-size 8 \\
        --model-id ms://Qwen/Qwen3-4B --template-cls Qwen3Template --dataset-id ms://swift/self-cognition

``--enable-liger`` trains with the fused linear cross-entropy (no logits tensor); ``--gradient-checkpointing``
recomputes activations; ``--resume-from-checkpoint output/fsdp2/last-checkpoint`` continues a run
exactly (model, optimizer, scheduler, RNG and the data position). Every option: ``--help``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from peft import LoraConfig
from torch.optim import Muon
from tqdm import tqdm

import twinkle
from twinkle import DeviceMesh, get_device_placement, get_logger, known_warnings
from twinkle.cli import CLI
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.preprocessor import SelfCognitionProcessor

logger = get_logger()
args = CLI.from_args(output_dir="output/fsdp2", train_samples=256, eval_samples=32, eval_interval=20,
                     log_interval=5, learning_rate=2e-2,
                     # this script's own options (args.extra), declared so that --model-name etc. are accepted
                     model_name="twinkle大模型", model_author="ModelScope社区", gradient_checkpointing=False)


def dataset(rows: range) -> Dataset:
    data = Dataset(dataset_meta=DatasetMeta(args.dataset.dataset_id, data_slice=rows))
    data.set_template(args.template.template_cls, model_id=args.model.model_id, max_length=args.template.max_length,
                      truncation_strategy=args.template.truncation_strategy)
    data.map(SelfCognitionProcessor(args.extra["model_name"],
                                    args.extra["model_author"]))
    data.encode()
    return data


def evaluate(model: TransformersModel, eval_set: Dataset) -> dict[str, float]:
    for batch in DataLoader(eval_set, batch_size=args.training.batch_size, shuffle=False, min_batch_size=1):
        model.forward_only(batch)
        model.calculate_loss()
    return model.calculate_metric(is_training=False)


def save(model: TransformersModel, name: str, loader: DataLoader) -> str:
    return model.save(name, output_dir=args.training.output_dir, adapter_name=args.lora.adapter_name,
                      save_optimizer=True, consumed_train_samples=loader.get_state()["consumed_train_samples"])


def main() -> str:
    known_warnings.silence(args.model.model_id)  # dependencies' notes that do not apply here (see the module)
    mesh = DeviceMesh.from_sizes(fsdp_size=args.infra.fsdp_size, dp_size=args.infra.dp_size)
    twinkle.initialize(mode=args.infra.mode, global_device_mesh=mesh, seed=args.training.seed)
    rows, eval_rows = args.training.train_samples, args.training.eval_samples
    train_set, eval_set = dataset(range(rows)), dataset(range(rows, rows + eval_rows))
    loader = DataLoader(train_set, batch_size=args.training.batch_size)  # the global batch; each rank its share
    total_steps = len(loader) // args.training.gradient_accumulation_steps

    model = TransformersModel(model_id=args.model.model_id, device_mesh=mesh, strategy=args.model.strategy,
                              mixed_precision=args.model.mixed_precision,
                              gradient_checkpointing=bool(args.extra["gradient_checkpointing"]))
    model.add_adapter_to_model(args.lora.adapter_name, LoraConfig(**args.get_lora_args()),
                               gradient_accumulation_steps=args.training.gradient_accumulation_steps)
    # Muon orthogonalises the 2-D LoRA matrices; adjust_lr_fn lets an AdamW-tuned lr carry over
    model.set_optimizer(Muon, lr=args.optimizer.learning_rate, adjust_lr_fn="match_rms_adamw")
    model.set_lr_scheduler(args.scheduler.scheduler_cls, num_warmup_steps=args.scheduler.num_warmup_steps,
                           num_training_steps=total_steps)
    if args.model.enable_liger and args.model.enable_fused_ce:
        model.apply_patch("TransformersFusedCEPatch")  # loss from hidden states: no (batch, seq, vocab) logits
    if args.training.resume_from_checkpoint:
        progress = model.resume_from_checkpoint(str(Path(args.training.resume_from_checkpoint).expanduser()),
                                                resume_only_model=args.training.resume_only_model)
        if not args.training.ignore_data_skip:
            loader.resume_from_checkpoint(progress["consumed_train_samples"])
    logger.info(get_device_placement())
    logger.info(model.get_train_configs())

    group, best = model.optimizer_group[args.lora.adapter_name], math.inf
    main_rank = int(os.environ.get("RANK", "0")) == 0
    bar = tqdm(total=total_steps, initial=group.cur_step, desc="fsdp2", dynamic_ncols=True, disable=not main_rank)
    for batch in loader:
        model.forward_backward(batch)
        model.clip_grad_and_step(max_grad_norm=args.optimizer.max_grad_norm)
        step = group.cur_step
        if group.micro_step or step == 0:  # inside an accumulation window
            continue
        bar.update(step - bar.n)
        if step % args.training.log_interval == 0:
            logger.info("step %d/%d: %s", step, total_steps, model.calculate_metric(is_training=True))
        if step % args.training.eval_interval == 0:
            metrics = evaluate(model, eval_set)
            logger.info("eval at step %d: %s", step, metrics)
            if metrics["loss"] < best:  # every rank saves: the shards come from all of them
                best = metrics["loss"]
                save(model, f"checkpoint-{step}", loader)
    bar.close()
    path = save(model, "last-checkpoint", loader)
    logger.info("last checkpoint: %s", path)
    return path


if __name__ == "__main__":
    main()
