"""Ranks whose micro-batches disagree on images, run by tests/multimodal/test_vl_processes.py.

``torchrun --nproc_per_node=2 vl_mixed_job.py OUT [STRATEGY,...]``: the tiny Qwen2.5-VL with LoRA on the language
model and the vision blocks and the projector trained whole, under DDP, native FSDP2 and
accelerate's FSDP2 in turn. The global batches of 4 rows are ordered so that each rank's slice
(rows r, r+2) has images on one rank only, then on the other, then on none, then on both. Each
strategy writes OUT/<strategy>.rank<r>.pt with the per-step losses, the full gradients of the
trainable parameters and the images each step had; :func:`mixed_run` on one process (the whole
global batch) is the reference.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from peft import LoraConfig  # noqa: E402
from vl_testing import FAMILIES, image_rows, model, text_rows  # noqa: E402

from twinkle.dataloader import DataLoader  # noqa: E402

STRATEGIES = ("ddp", "native_fsdp", "accelerate")
#: per global batch of 4, which rows have an image: rank 0 reads rows 0 and 2, rank 1 rows 1 and 3
PATTERN = ((1, 0, 1, 0), (0, 1, 0, 1), (0, 0, 0, 0), (1, 1, 1, 1))


def mixed_rows() -> list[dict]:
    """Image rows (shapes) and text-only rows in one source, in the order PATTERN gives."""
    flags = [f for step in PATTERN for f in step]
    images, texts = iter(image_rows(sum(flags), seed=3)), iter(text_rows(len(flags) - sum(flags)))
    return [next(images) if flag else next(texts) for flag in flags]


def mixed_run(strategy: str = "native_fsdp") -> dict:
    from twinkle import DeviceMesh
    from twinkle.collective import full_tensor
    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.preprocessor import MessagesProcessor

    world = int(os.environ.get("WORLD_SIZE", "1"))
    ds = Dataset(DatasetMeta(data=mixed_rows()))
    ds.set_template(FAMILIES["qwen2_5_vl"][0], model_id=FAMILIES["qwen2_5_vl"][1])
    ds.map(MessagesProcessor())
    ds.encode()
    sizes = {"dp_size": world} if strategy == "ddp" else {"fsdp_size": world}
    mesh = DeviceMesh.from_sizes(world_size=world, **sizes)
    vl = model("qwen2_5_vl", strategy="native_fsdp" if strategy == "ddp" else strategy, device_mesh=mesh)
    vl.set_template(ds.template)
    torch.manual_seed(1)
    vl.add_adapter_to_model("sft", LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
                            vision_tower="lora", projector="full")
    vl.set_optimizer("SGD", lr=0.5)  # linear in the gradient: float noise is not amplified as by Adam
    group = vl.optimizer_group["sft"]
    names = {id(p): n for n, p in vl.model.named_parameters()}
    losses, grads, images = [], [], []
    for batch in DataLoader(ds, batch_size=4, shuffle=False):
        images.append(sum(len(row["images"]) for row in batch))
        losses.append(float(vl.forward_backward(inputs=batch)))
        grads.append({names[id(p)]: None if p.grad is None else full_tensor(p.grad).clone()
                      for p in vl.backend.parameters(group)})
        vl.clip_grad_and_step()
    return {"losses": losses, "grads": grads, "images": images, "kind": vl.backend.dist_plan.kind}


def main() -> None:
    import twinkle

    out = Path(sys.argv[1])
    twinkle.initialize(seed=0, timeout_s=60)
    rank = int(os.environ["RANK"])
    for strategy in sys.argv[2].split(",") if len(sys.argv) > 2 else STRATEGIES:
        torch.save(mixed_run(strategy), out / f"{strategy}.rank{rank}.pt")
        print(f"rank {rank}: {strategy} done", flush=True)


if __name__ == "__main__":
    main()
