"""torchrun job (2 CPU ranks): tenants acquired, trained and released on a DDP- or FSDP2-wrapped
multi-LoRA model.

Usage: torchrun --nproc_per_node=2 dist_job.py OUT_DIR MODE [MODE ...] (ddp, fsdp2); ``run()`` in one
process is the reference. Writes OUT_DIR/<mode>.rank<r>.pt or OUT_DIR/<mode>.rank<r>.error.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hf"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_testing import make_batch, tiny_config  # noqa: E402


def rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rows(batch: dict, rank: int, world: int) -> dict:
    return {k: v[rank::world] for k, v in batch.items()}


def run(mode: str = "ddp") -> dict:
    from peft import LoraConfig

    from twinkle import DeviceMesh
    from twinkle.model import MultiLoraTransformersModel

    rank, world = rank_world()
    torch.manual_seed(0)
    fsdp = world if mode == "fsdp2" else 1
    model = MultiLoraTransformersModel(config=tiny_config(), mixed_precision="no", max_loras=2, max_r=8,
                                       strategy="native_fsdp",
                                       device_mesh=DeviceMesh.from_sizes(fsdp_size=fsdp, world_size=world))
    losses: dict[str, list[float]] = {"a": [], "b": [], "multi": []}
    model.multi_lora.acquire_lora("a", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    # 'b' targets one layer only: most parameters of the model are unused (frozen base, other slot) for it
    model.multi_lora.acquire_lora("b", LoraConfig(r=2, lora_alpha=4, target_modules=["model.layers.1.mlp.up_proj"]))
    for tenant in ("a", "b"):
        model.set_optimizer("AdamW", lr=0.02, adapter_name=tenant)
    for step in range(3):
        for tenant in ("a", "b"):
            batch = rows(make_batch(10 * step + len(losses[tenant]), rows=4), rank, world)
            losses[tenant].append(model.forward_backward(inputs=batch, adapter_name=tenant))
            model.clip_grad_and_step(adapter_name=tenant)
    multi = model.forward_backward_multi({t: rows(make_batch(50 + i, rows=4), rank, world)
                                          for i, t in enumerate(("a", "b"))})
    losses["multi"] = [multi["a"], multi["b"]]
    for tenant in ("a", "b"):
        model.clip_grad_and_step(adapter_name=tenant)
    state_b = model.get_state_dict(adapter_name="b")
    model.multi_lora.release_lora("a")
    model.multi_lora.acquire_lora("c", LoraConfig(r=8, lora_alpha=8, target_modules="all-linear"))
    model.set_optimizer("AdamW", lr=0.02, adapter_name="c")
    losses["c"] = [model.forward_backward(inputs=rows(make_batch(77, rows=4), rank, world), adapter_name="c")]
    model.clip_grad_and_step(adapter_name="c")
    return {"losses": losses, "b": state_b, "c": model.get_state_dict(adapter_name="c"),
            "names": model.multi_lora.names(), "kind": model.backend.dist_plan.kind}


def main() -> None:
    import twinkle

    out, modes = Path(sys.argv[1]), sys.argv[2:]
    twinkle.initialize(seed=0, timeout_s=120)
    rank, _ = rank_world()
    for mode in modes:
        try:
            result = run(mode)
        except Exception:
            (out / f"{mode}.rank{rank}.error").write_text(traceback.format_exc())
            raise
        torch.save(result, out / f"{mode}.rank{rank}.pt")


if __name__ == "__main__":
    main()
