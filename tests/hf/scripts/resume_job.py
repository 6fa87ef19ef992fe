"""Train tiny runs for the bitwise-resume test; run as a fresh process by tests/hf/test_resume_bitwise.py.

``resume_job.py OUT uninterrupted``: for every combo, train 2N optimizer steps, saving a checkpoint
after step N; write every micro-batch loss (float.hex) to OUT/uninterrupted.json.
``resume_job.py OUT resume``: for every combo, build the same set-up, resume model and DataLoader from
the step-N checkpoint and train to step 2N; write the losses to OUT/resume.json.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import AutoConfig  # noqa: E402

from twinkle.dataloader import DataLoader  # noqa: E402
from twinkle.dataset import Dataset, DatasetMeta  # noqa: E402
from twinkle.hub import resolve_path  # noqa: E402
from twinkle.model import TransformersModel  # noqa: E402
from twinkle.preprocessor import SelfCognitionProcessor  # noqa: E402

HALF = 3  # N: save after N optimizer steps, stop after 2N
#: name -> (lora?, optimizer, optimizer kwargs, gradient accumulation)
COMBOS = {
    "lora-adamw": (True, "AdamW", {"lr": 5e-3}, 1),
    "lora-muon": (True, "Muon", {"lr": 2e-2, "adjust_lr_fn": "match_rms_adamw"}, 2),
    "full-adamw": (False, "AdamW", {"lr": 2e-3}, 1),
    "full-muon": (False, "Muon", {"lr": 1e-2, "adjust_lr_fn": "match_rms_adamw"}, 1),
}


def build_dataset() -> Dataset:
    dataset = Dataset(DatasetMeta("twinkle://self-cognition", data_slice=range(24)))
    dataset.set_template("Qwen2_5Template", model_id="twinkle://tiny-qwen", max_length=128)
    dataset.map(SelfCognitionProcessor("twinkle", "ModelScope"))
    dataset.encode()
    return dataset


def build(name: str):
    lora, optimizer, kwargs, accumulation = COMBOS[name]
    torch.manual_seed(1234)
    config = AutoConfig.from_pretrained(resolve_path("twinkle://tiny-qwen"))
    config.attention_dropout = 0.0 if lora else 0.1  # dropout draws from the RNG the checkpoint restores
    model = TransformersModel(config=config, mixed_precision="no")
    adapter = None
    if lora:
        adapter = "sft"
        model.add_adapter_to_model(adapter, LoraConfig(r=4, lora_alpha=16, lora_dropout=0.1,
                                                       target_modules="all-linear"),
                                   gradient_accumulation_steps=accumulation)
    else:
        model.optimizer_group["default"].gradient_accumulation_steps = accumulation
    model.set_optimizer(optimizer, **kwargs)
    model.set_lr_scheduler("CosineWarmupScheduler", num_warmup_steps=1, num_training_steps=2 * HALF)
    return model, adapter


def train(model, adapter, loader, stop_at: int, save: tuple[str, str] | None) -> list[str]:
    group = model.optimizer_group[adapter or "default"]
    losses = []
    while group.cur_step < stop_at:
        for batch in loader:
            losses.append(float(model.forward_backward(inputs=batch, adapter_name=adapter)).hex())
            model.clip_grad_and_step(adapter_name=adapter)
            if save is not None and group.cur_step == HALF and group.micro_step == 0:
                model.save(save[1], output_dir=save[0], adapter_name=adapter, save_optimizer=True,
                           consumed_train_samples=loader.get_state()["consumed_train_samples"])
                losses.append("saved")
                save = None
            if group.cur_step >= stop_at:
                break
    return losses


def main(out: str, phase: str) -> None:
    dataset = build_dataset()
    results = {}
    for name in COMBOS:
        model, adapter = build(name)
        loader = DataLoader(dataset, batch_size=4, shuffle=True, seed=7)
        if phase == "uninterrupted":
            results[name] = train(model, adapter, loader, 2 * HALF, (out, name))
        else:
            progress = model.resume_from_checkpoint(os.path.join(out, name), adapter_name=adapter)
            loader.resume_from_checkpoint(progress["consumed_train_samples"])
            results[name] = train(model, adapter, loader, 2 * HALF, None)
            results[name + ":progress"] = progress
    with open(os.path.join(out, f"{phase}.json"), "w") as handle:
        json.dump(results, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
