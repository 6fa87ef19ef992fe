"""LoRA SFT of a vision-language model: "What colour is the shape?" on generated images.

On CPU the default tiny Qwen2.5-VL (random init, ``twinkle://tiny-qwen2.5-vl``) learns the answer
in about a minute; ``--model-id Qwen/Qwen2.5-VL-3B-Instruct`` (or ``ms://...``, a local directory)
trains the real model with the same script (add ``--mixed-precision bf16`` on a GPU). The images
are made here (twinkle.multimodal.shapes); any dataset of rows with ``messages`` + ``images``
goes through the same path.

    python cookbook/multimodal/vl_lora_sft.py                      # tiny model, CPU
    python cookbook/multimodal/vl_lora_sft.py --model-id Qwen/Qwen2.5-VL-3B-Instruct --mixed-precision bf16
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from peft import LoraConfig
from tqdm import tqdm

import twinkle
from twinkle import known_warnings
from twinkle.dataloader import DataLoader
from twinkle.dataset import Dataset, DatasetMeta
from twinkle.model import TransformersModel
from twinkle.multimodal.shapes import shape_rows
from twinkle.preprocessor import MessagesProcessor

TINY = "twinkle://tiny-qwen2.5-vl"


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-id", default=TINY)
    parser.add_argument("--template", default="Qwen2_5VLTemplate")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--mixed-precision", default="no")
    parser.add_argument("--output-dir", default="output/vl_lora_sft")
    parser.add_argument("--seed", type=int, default=0, help="the adapter's init and the data order")
    parser.add_argument("--results-json", default=None, help="also write the losses and the checkpoint to this file")
    return parser.parse_args()


def main() -> None:
    args = parse()
    known_warnings.silence(args.model_id)  # dependencies' notes that do not apply here (see the module)
    twinkle.initialize(seed=args.seed)  # the adapter's init and the data order: the same run every time
    start = time.time()
    # data: rows with '<image>' tags and their images (PNG bytes); the template runs the model's processor
    rows = [{"messages": r["messages"], "images": r["images"]} for r in shape_rows(args.samples, seed=0)]
    dataset = Dataset(DatasetMeta(data=rows))
    dataset.set_template(args.template, model_id=args.model_id, max_length=1024, truncation_strategy="delete")
    dataset.map(MessagesProcessor())
    dataset.encode()
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, seed=args.seed)

    # model: the image-text-to-text class is read from the config; LoRA on the language model
    model = TransformersModel(model_id=args.model_id, mixed_precision=args.mixed_precision)
    model.set_template(dataset.template)  # collates images, and saves the processor with each checkpoint
    tiny = args.model_id == TINY  # a random tiny model also trains its output head (it starts too small)
    model.add_adapter_to_model("vl", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                modules_to_save=["lm_head"] if tiny else None))
    model.set_optimizer("AdamW", lr=args.lr)

    total = args.epochs * len(loader) if not args.max_steps else min(args.max_steps, args.epochs * len(loader))
    losses: list[float] = []
    bar = tqdm(total=total, desc="vl_lora_sft", dynamic_ncols=True)
    while len(losses) < total:
        for batch in loader:
            losses.append(float(model.forward_backward(inputs=batch)))  # a LazyFloat, read once per step (shown)
            model.clip_grad_and_step()
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
            if len(losses) >= total:
                break
    bar.close()
    path = str(Path(model.save("final", output_dir=args.output_dir)).resolve())
    seconds = round(time.time() - start, 1)
    print(f"loss {losses[0]:.2f} -> {losses[-1]:.2f} in {len(losses)} steps ({seconds} s); adapter: {path}")
    if args.results_json:
        Path(args.results_json).write_text(json.dumps({"losses": losses, "seconds": seconds, "checkpoint": path}))


if __name__ == "__main__":
    main()
