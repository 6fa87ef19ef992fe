"""Multi-process VL checks, run as fresh processes by tests/multimodal/test_vl_processes.py.

``vl_job.py OUT uninterrupted|resume``: LoRA (dropout on) SFT of the tiny Qwen2.5-VL for 2N steps,
saving after N; ``resume`` rebuilds everything in a new process, resumes model and DataLoader from
the checkpoint and writes the losses of steps N+1..2N (float.hex) to OUT/<phase>.json.
``torchrun --nproc_per_node=2 vl_job.py OUT fsdp``: the same model, LoRA + projector, on FSDP2 over
2 ranks (each rank its DataLoader slice); writes OUT/fsdp.rank<r>.pt with the losses and the final
trainable parameters. :func:`fsdp_run` with one process is the test's reference.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from peft import LoraConfig  # noqa: E402
from vl_testing import dataset, model  # noqa: E402

from twinkle.dataloader import DataLoader  # noqa: E402

HALF = 3
FSDP_STEPS = 4


def _lora(dropout: float) -> LoraConfig:
    return LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules="all-linear",
                      modules_to_save=["lm_head"])


def resume_run(out: str, phase: str) -> None:
    ds = dataset("qwen2_5_vl", n=16)
    vl = model("qwen2_5_vl")
    vl.set_template(ds.template)
    vl.add_adapter_to_model("sft", _lora(0.1))
    vl.set_optimizer("AdamW", lr=1e-2)
    vl.set_lr_scheduler("CosineWarmupScheduler", num_warmup_steps=1, num_training_steps=2 * HALF)
    loader = DataLoader(ds, batch_size=4, shuffle=True, seed=5)
    group = vl.optimizer_group["sft"]
    result: dict = {"losses": []}
    if phase == "resume":
        result["progress"] = vl.resume_from_checkpoint(os.path.join(out, "ckpt"))
        loader.resume_from_checkpoint(result["progress"]["consumed_train_samples"])
    while group.cur_step < 2 * HALF:
        for batch in loader:
            result["losses"].append(float.hex(float(vl.forward_backward(inputs=batch))))
            vl.clip_grad_and_step()
            if phase == "uninterrupted" and group.cur_step == HALF:
                vl.save("ckpt", output_dir=out, save_optimizer=True,
                        consumed_train_samples=loader.get_state()["consumed_train_samples"])
                result["saved_after"] = len(result["losses"])
            if group.cur_step >= 2 * HALF:
                break
    Path(out, f"{phase}.json").write_text(json.dumps(result))


def fsdp_run() -> dict:
    """LoRA on the language model plus the projector trained whole, FSDP2 when launched on 2 ranks."""
    from twinkle import DeviceMesh
    from twinkle.collective import full_tensor

    world = int(os.environ.get("WORLD_SIZE", "1"))
    ds = dataset("qwen2_5_vl", n=16)
    mesh = DeviceMesh.from_sizes(fsdp_size=world, world_size=world)
    vl = model("qwen2_5_vl", strategy="native_fsdp", device_mesh=mesh)
    vl.set_template(ds.template)
    torch.manual_seed(1)
    vl.add_adapter_to_model("sft", _lora(0.0), projector="full")
    vl.set_optimizer("AdamW", lr=1e-2, eps=1.0)  # Lipschitz in the gradient: the ranks' rounding stays bounded
    loader = DataLoader(ds, batch_size=4, shuffle=True, seed=5)
    group = vl.optimizer_group["sft"]
    names = {id(p): n for n, p in vl.model.named_parameters()}
    initial = {names[id(p)]: full_tensor(p.detach()).clone() for p in vl.backend.parameters(group)}
    losses = []
    for batch in loader:
        losses.append(float(vl.forward_backward(inputs=batch)))
        vl.clip_grad_and_step()
        if len(losses) == FSDP_STEPS:
            break
    params = {names[id(p)]: full_tensor(p.detach()).clone() for p in vl.backend.parameters(group)}
    return {"losses": losses, "params": params, "initial": initial, "layers": vl.backend.layer_classes}


def main() -> None:
    out, phase = sys.argv[1], sys.argv[2]
    if phase != "fsdp":
        resume_run(out, phase)
        return
    import twinkle

    twinkle.initialize(seed=0, timeout_s=120)
    rank = int(os.environ["RANK"])
    torch.save(fsdp_run(), Path(out) / f"fsdp.rank{rank}.pt")


if __name__ == "__main__":
    main()
