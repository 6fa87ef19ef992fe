"""Tensor-parallel training scenarios, run under torchrun (tp=2) and in one process (the reference).

Usage: torchrun --nproc_per_node=2 tp_job.py OUT_DIR SCENARIO [SCENARIO ...]
Writes OUT_DIR/<scenario>.rank<r>.pt, or OUT_DIR/<scenario>.rank<r>.error with the traceback. Every rank
trains on the whole batch (tensor-parallel ranks share their data) under SGD, and returns its losses,
grad norms, trained parameters (full tensors), logits on a held-out batch, its decoder layers' parameter
bytes and, on rank 0, the path of the HF export it saved.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hf"))

from hf_testing import make_batch, tiny_config  # noqa: E402

STEPS, ROWS, SEQ, LR = 3, 4, 12, 0.5
#: every style a LoRA layer takes under TP: column- and row-parallel, and the gathered LM head (replicated adapters)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def lora_config() -> Any:
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS, lora_dropout=0.0, init_lora_weights="gaussian")


def data_rows(batch: dict[str, torch.Tensor], fsdp: int) -> dict[str, torch.Tensor]:
    """This rank's rows: data rank ``rank // tp`` of ``fsdp`` (tp varies fastest; the DataLoader's slice)."""
    import torch.distributed as dist

    if world() == 1:
        return batch
    data_rank = dist.get_rank() // (world() // fsdp)
    return {k: v[data_rank::fsdp] for k, v in batch.items()}


def build(lora: bool, family: str = "qwen2", fsdp: int = 1, momentum: float = 0.0, lr: float = LR) -> Any:
    from twinkle import DeviceMesh
    from twinkle.model import TransformersModel

    n = world()
    mesh = DeviceMesh.from_sizes(tp_size=n // fsdp, fsdp_size=fsdp, world_size=n) if n > 1 else None
    torch.manual_seed(0)
    model = TransformersModel(config=tiny_config(family), device_mesh=mesh, mixed_precision="no")
    adapter = None
    if lora:
        adapter = "a"
        torch.manual_seed(1)
        model.add_adapter_to_model(adapter, lora_config())
    model.set_optimizer("SGD", lr=lr, momentum=momentum, adapter_name=adapter)
    return model, adapter


def layer_bytes(model: Any) -> int:
    """Bytes of the decoder layers' parameters this rank holds (a DTensor's local shard only)."""
    total = 0
    for name, param in model.model.named_parameters():
        if ".layers." in name:
            local = param.to_local() if hasattr(param, "to_local") else param
            total += local.numel() * local.element_size()
    return total


def trainable(model: Any, adapter: str | None) -> dict[str, torch.Tensor]:
    """The trainable parameters as full tensors, by name (a collective when sharded)."""
    from twinkle.collective import full_tensor

    names = {id(p): n for n, p in model.model.named_parameters()}
    return {names[id(p)]: full_tensor(p.detach()).clone() for p in model.backend.parameters(model._group(adapter))}


def run(lora: bool, out: Path | None, family: str = "qwen2", accumulation: int = 1, fsdp: int = 1) -> dict[str, Any]:
    """Train STEPS steps (each of ``accumulation`` micro-batches of ROWS / accumulation rows), on ``world /
    fsdp`` tensor-parallel ranks times ``fsdp`` FSDP2 ranks (each FSDP2 rank reading its rows)."""
    model, adapter = build(lora, family, fsdp if world() > 1 else 1)
    initial = trainable(model, adapter)
    losses, norms = [], []
    for step in range(STEPS):
        batch = make_batch(100 + step, rows=ROWS, length=SEQ)
        chunk = ROWS // accumulation
        for i in range(accumulation):
            micro = data_rows({k: v[i * chunk:(i + 1) * chunk] for k, v in batch.items()}, fsdp)
            losses.append(float(model.forward_backward(inputs=micro, adapter_name=adapter,
                                                       gradient_accumulation_steps=accumulation)))
        model.clip_grad_and_step(max_grad_norm=1e9, adapter_name=adapter)
        norms.append(model.calculate_metric(is_training=True, adapter_name=adapter)["grad_norm"])
    params = trainable(model, adapter)
    held_out = make_batch(999, rows=2, length=SEQ)
    logits = model.forward_only(inputs=held_out, adapter_name=adapter)["logits"].detach().clone()
    state = model.get_state_dict(adapter_name=adapter)
    result = {"losses": losses, "grad_norms": norms, "params": params, "initial": initial, "logits": logits,
              "held_out": held_out, "layer_bytes": layer_bytes(model),
              "state_is_full": all(not hasattr(v, "to_local") for v in state.values()),
              "state_keys": sorted(state), "wrapped": model.backend.dist_plan.kind}
    if out is not None and family == "qwen2":
        name = f"export_{'lora' if lora else 'full'}{'_fsdp' if fsdp > 1 else ''}"
        result["export"] = model.save(name, output_dir=str(out), adapter_name=adapter)
    return result


# momentum: the optimizer state must cross the layouts too; a smaller lr keeps its 5 steps in the regime where
# the update is a small change of the weights (at LR with momentum the LM head's adapter grows 30-fold)
CKPT_STEPS, MOMENTUM, CKPT_LR = 2, 0.5, 0.1


def train_steps(model: Any, adapter: str | None, steps: range, fsdp: int) -> list[float]:
    """One micro-batch per step on this rank's rows of batch ``100 + step``; the global losses."""
    losses = []
    for step in steps:
        batch = data_rows(make_batch(100 + step, rows=ROWS, length=SEQ), fsdp)
        losses.append(float(model.forward_backward(inputs=batch, adapter_name=adapter)))
        model.clip_grad_and_step(max_grad_norm=1e9, adapter_name=adapter)
    return losses


def checkpointed(lora: bool, out: Path, fsdp: int) -> dict[str, Any]:
    """CKPT_STEPS steps, a checkpoint (DCP shards + HF export), then STEPS more: the uninterrupted run."""
    model, adapter = build(lora, fsdp=fsdp, momentum=MOMENTUM, lr=CKPT_LR)
    initial = trainable(model, adapter)
    before = train_steps(model, adapter, range(CKPT_STEPS), fsdp)
    at_save = trainable(model, adapter)
    path = model.save(f"ckpt_{'lora' if lora else 'full'}", output_dir=str(out), adapter_name=adapter,
                      save_optimizer=True)
    continued = train_steps(model, adapter, range(CKPT_STEPS, CKPT_STEPS + STEPS), fsdp)
    return {"before": before, "continued": continued, "path": path, "initial": initial, "at_save": at_save,
            "params": trainable(model, adapter)}


def resumed(lora: bool, out: Path, fsdp: int) -> dict[str, Any]:
    """A fresh model on this layout resumed from :func:`checkpointed`'s checkpoint, trained the same steps."""
    model, adapter = build(lora, fsdp=fsdp, momentum=MOMENTUM, lr=CKPT_LR)
    model.resume_from_checkpoint(str(out / f"ckpt_{'lora' if lora else 'full'}"), adapter_name=adapter)
    losses = train_steps(model, adapter, range(CKPT_STEPS, CKPT_STEPS + STEPS), fsdp)
    return {"resumed": losses, "wrapped": model.backend.dist_plan.kind, "params": trainable(model, adapter)}


SCENARIOS = {"tp_full": lambda out: run(False, out), "tp_lora": lambda out: run(True, out),
             # Qwen3's per-head q_norm/k_norm: partial gradients, summed per micro-batch
             "tp_qwen3_accum": lambda out: run(False, out, family="qwen3", accumulation=2),
             # FSDP2 x TP on 4 ranks: fsdp=2 (rows split) x tp=2
             "fsdp_tp_full": lambda out: run(False, out, fsdp=2),
             "fsdp_tp_lora": lambda out: run(True, out, fsdp=2),
             "fsdp_tp_qwen3_accum": lambda out: run(False, out, family="qwen3", accumulation=2, fsdp=2),
             "fsdp_tp_ckpt_full": lambda out: checkpointed(False, out, fsdp=2),
             "fsdp_tp_ckpt_lora": lambda out: checkpointed(True, out, fsdp=2),
             # launched on 2 ranks after the 4-rank run, in its directory: FSDP2 alone (fsdp=2, tp=1)
             "resume_fsdp_full": lambda out: resumed(False, out, fsdp=2),
             "resume_fsdp_lora": lambda out: resumed(True, out, fsdp=2)}


def main() -> None:
    import torch.distributed as dist

    import twinkle

    out, names = Path(sys.argv[1]), sys.argv[2:]
    twinkle.initialize(seed=0, timeout_s=120)
    rank = dist.get_rank()
    for name in names:
        try:
            result = SCENARIOS[name](out)
        except Exception:
            (out / f"{name}.rank{rank}.error").write_text(traceback.format_exc())
            raise
        torch.save(result, out / f"{name}.rank{rank}.pt")


if __name__ == "__main__":
    main()
