"""Sequence-parallel scenarios, run under torchrun (cp=2) and in one process (the reference).

Usage: torchrun --nproc_per_node=2 sp_job.py OUT_DIR SCENARIO [SCENARIO ...]
Writes OUT_DIR/<scenario>.rank<r>.pt, or OUT_DIR/<scenario>.rank<r>.error with the traceback. Both ranks read
the same rows (the cp ranks share their data) and each keeps half of every row; training runs under SGD and
returns losses, grad norms and trained parameters. ``memory`` returns the bytes of activations a training
forward of one 4096-token row saves for the backward, and ``trainer`` runs the Trainer with ``sp_size=2``.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hf"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "trainer"))

from hf_testing import make_batch, tiny_config  # noqa: E402

STEPS, ROWS, SEQ, LR = 3, 4, 13, 0.5  # 13: rows of odd length, padded to a multiple of cp inside the model
MEMORY_TOKENS = 4096
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def world() -> int:
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def build(lora: bool, family: str = "qwen2", attn: str = "sdpa", **config: Any) -> tuple[Any, str | None]:
    from peft import LoraConfig

    from twinkle import DeviceMesh
    from twinkle.model import TransformersModel

    n = world()
    mesh = DeviceMesh.from_sizes(cp_size=n, world_size=n) if n > 1 else None
    torch.manual_seed(0)
    hf_config = tiny_config(family, **config)
    hf_config._attn_implementation = attn
    model = TransformersModel(config=hf_config, device_mesh=mesh, mixed_precision="no")
    adapter = None
    if lora:
        adapter = "a"
        torch.manual_seed(1)
        model.add_adapter_to_model(adapter, LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS,
                                                       lora_dropout=0.0, init_lora_weights="gaussian"))
    model.set_optimizer("SGD", lr=LR, adapter_name=adapter)
    return model, adapter


def packed(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The real tokens of a padded batch as one packed row (InputProcessor(padding_free=True)'s layout)."""
    ids, labels, positions = [], [], []
    for row in range(batch["input_ids"].shape[0]):
        n = int(batch["attention_mask"][row].sum())
        ids.append(batch["input_ids"][row, :n])
        row_labels = batch["labels"][row, :n].clone()
        row_labels[0] = -100  # nothing predicts a sequence's first token from the previous sequence
        labels.append(row_labels)
        positions.append(torch.arange(n))
    return {"input_ids": torch.cat(ids)[None], "labels": torch.cat(labels)[None],
            "position_ids": torch.cat(positions)[None]}


def train(lora: bool, rows: str, family: str = "qwen2", attn: str = "sdpa", **config: Any) -> dict[str, Any]:
    model, adapter = build(lora, family, attn, **config)
    group = model._group(adapter)
    names = {id(p): n for n, p in model.model.named_parameters()}
    initial = {names[id(p)]: p.detach().clone() for p in model.backend.parameters(group)}
    losses, norms = [], []
    for step in range(STEPS):
        batch = make_batch(100 + step, rows=ROWS, length=SEQ)
        batch = packed(batch) if rows == "packed" else batch
        losses.append(float(model.forward_backward(inputs=batch, adapter_name=adapter)))
        model.clip_grad_and_step(max_grad_norm=1e9, adapter_name=adapter)
        norms.append(model.calculate_metric(is_training=True, adapter_name=adapter)["grad_norm"])
    params = {names[id(p)]: p.detach().clone() for p in model.backend.parameters(group)}
    return {"losses": losses, "grad_norms": norms, "params": params, "initial": initial,
            "wrapped": model.backend.dist_plan.kind, "split": model.backend.sequence_parallel is not None,
            "attn": sp.inner if (sp := model.backend.sequence_parallel) else model.backend.config._attn_implementation}


def saved_activation_bytes(model: Any, batch: dict[str, torch.Tensor]) -> int:
    """Bytes of the distinct storages a training forward saves for its backward, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.forward(inputs=batch)
    return sum(seen.values())


def memory() -> dict[str, Any]:
    """One 4096-token row (real tokens only: sdpa runs causal without a mask, on one process and split)."""
    model, _ = build(False, max_position_embeddings=MEMORY_TOKENS)
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 128, (1, MEMORY_TOKENS), generator=gen)
    return {"activation_bytes": saved_activation_bytes(model, {"input_ids": ids, "labels": ids.clone()})}


#: the Trainer run: plain SGD at a constant lr, clipped, on packed micro-batches (xtuner's pack_to_max_length),
#: with activation checkpointing (the backward recomputes each layer's forward, head exchanges included) and an
#: evaluation (forward_only and the loss of split rows) at the end
TRAINER_STEPS = 2
TRAINER_JOB = {"total_step": TRAINER_STEPS, "checkpoint_interval": TRAINER_STEPS,
               "model": {"gradient_checkpointing": True}, "eval_interval": TRAINER_STEPS,
               "dataset": {"train_samples": 16, "eval_samples": 4, "max_length": 128},
               "optimizer": {"name": "SGD", "lr": 5e-2, "max_grad_norm": 1.0}, "lr": {"scheduler": None},
               "dataloader": {"gradient_accumulation_steps": 2, "pack_to_max_length": True}}


def trainer(out: Path | None, work_dir: Path | None = None, sp_size: int | None = None) -> dict[str, Any]:
    """The Trainer with ``sp_size`` (xtuner's name of the sequence-parallel size); its final adapter weights."""
    from trainer_testing import load_weights, tiny_job

    from twinkle.trainer import Trainer

    work_dir = work_dir or out / "trainer_sp"
    job = tiny_job(work_dir, **TRAINER_JOB)
    if sp_size is not None:
        job["sp_size"] = sp_size
    trained = Trainer(**job)
    result = trained.fit()
    final = work_dir / "checkpoints" / f"step-{TRAINER_STEPS:08d}" / "model"
    return {"step": result.step, "final_loss": result.final_loss, "eval_loss": result.best_eval_loss,
            "weights": load_weights(final),
            "split": trained.model.backend.sequence_parallel is not None,
            "checkpointing": trained.model.backend.hf_model().is_activation_checkpointing}


SCENARIOS = {
    "sp_full_padded": lambda: train(False, "padded"),
    "sp_lora_packed": lambda: train(True, "packed"),
    # eager attention; one key/value head for two ranks (each rank gets the copies its query heads use)
    "sp_full_packed_eager_gqa": lambda: train(False, "packed", attn="eager", num_key_value_heads=1),
    "sp_lora_padded_qwen3": lambda: train(True, "padded", family="qwen3"),
    "memory": memory,
    "trainer": lambda out: trainer(out, sp_size=2),
}


def main() -> None:
    import torch.distributed as dist

    import twinkle

    out, names = Path(sys.argv[1]), sys.argv[2:]
    twinkle.initialize(seed=0, timeout_s=120)
    rank = dist.get_rank()
    for name in names:
        try:
            result = SCENARIOS[name](out) if name == "trainer" else SCENARIOS[name]()
        except Exception:
            (out / f"{name}.rank{rank}.error").write_text(traceback.format_exc())
            raise
        torch.save(result, out / f"{name}.rank{rank}.pt")


if __name__ == "__main__":
    main()
