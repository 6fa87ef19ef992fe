"""Expert-parallel training scenarios (FSDP2 x EP: fsdp=2 x ep=2 on 2 ranks, fsdp=4 x ep=2 on 4), run under
torchrun and in one process.

Usage: torchrun --nproc_per_node=N ep_job.py OUT_DIR SCENARIO [SCENARIO ...]
Writes OUT_DIR/<scenario>.rank<r>.pt, or OUT_DIR/<scenario>.rank<r>.error with the traceback. Each rank trains
on its rows ``rank::world`` of the same global batches under SGD and returns its losses, grad norms, trained
parameters (full tensors) and the bytes of the expert weights it holds.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hf"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "families"))

from hf_testing import make_batch  # noqa: E402

STEPS, ROWS, SEQ, LR, VOCAB = 3, 4, 12, 0.5, 128
#: LoRA on attention (the routed experts stay frozen and expert-parallel; LoRA on them is refused under EP)
LORA_TARGETS = {"qwen3_5_moe": ["q_proj", "k_proj", "v_proj", "o_proj"],
                "deepseek_v3": ["q_b_proj", "kv_b_proj", "o_proj"]}


def rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def config(family: str) -> Any:
    from family_testing import deepseek_v3_config, qwen3_5_moe_config

    return qwen3_5_moe_config(VOCAB) if family == "qwen3_5_moe" else deepseek_v3_config(VOCAB)


def build(family: str, lora: bool, ep: int | None = None) -> tuple[Any, str | None]:
    from peft import LoraConfig

    from twinkle import DeviceMesh
    from twinkle.model import TransformersModel

    _, n = rank_world()
    mesh = DeviceMesh.from_sizes(fsdp_size=n, ep_size=ep or n, world_size=n) if n > 1 else None
    torch.manual_seed(0)
    model = TransformersModel(config=config(family), device_mesh=mesh, mixed_precision="no")
    adapter = None
    if lora:
        adapter = "a"
        torch.manual_seed(1)
        model.add_adapter_to_model(adapter, LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS[family],
                                                       lora_dropout=0.0, init_lora_weights="gaussian"))
    model.set_optimizer("SGD", lr=LR, adapter_name=adapter)
    return model, adapter


def expert_bytes(model: Any) -> int:
    """Bytes of the routed experts' 3-D weights this rank holds (a DTensor's local shard only)."""
    total = 0
    for name, param in model.backend.hf_model().named_parameters():
        if ".mlp.experts." in name:
            local = param.to_local() if hasattr(param, "to_local") else param
            total += local.numel() * local.element_size()
    return total


def run(family: str, lora: bool, ep: int | None = None) -> dict[str, Any]:
    """STEPS SGD steps; under torchrun on fsdp=world x ep=``ep`` (default: the world)."""
    from twinkle.collective import full_tensor

    rank, world = rank_world()
    model, adapter = build(family, lora, ep)
    group = model._group(adapter)
    names = {id(p): n for n, p in model.model.named_parameters()}
    initial = {names[id(p)]: full_tensor(p.detach()).clone() for p in model.backend.parameters(group)}
    losses, norms = [], []
    for step in range(STEPS):
        batch = make_batch(100 + step, rows=ROWS, length=SEQ, vocab=VOCAB)
        mine = {k: v[rank::world] for k, v in batch.items()}
        losses.append(float(model.forward_backward(inputs=mine, adapter_name=adapter)))
        model.clip_grad_and_step(max_grad_norm=1e9, adapter_name=adapter)
        norms.append(model.calculate_metric(is_training=True, adapter_name=adapter)["grad_norm"])
    params = {names[id(p)]: full_tensor(p.detach()).clone() for p in model.backend.parameters(group)}
    state = model.get_state_dict(adapter_name=adapter)
    return {"losses": losses, "grad_norms": norms, "params": params, "initial": initial,
            "expert_bytes": expert_bytes(model), "wrapped": model.backend.dist_plan.kind,
            "ep_size": model.backend.dist_plan.ep_size,
            "state_is_full": all(not hasattr(v, "to_local") for v in state.values()), "state_keys": sorted(state)}


SCENARIOS = {"ep_qwen3_5_moe_full": lambda: run("qwen3_5_moe", False),
             "ep_qwen3_5_moe_lora": lambda: run("qwen3_5_moe", True),
             "ep_deepseek_v3_full": lambda: run("deepseek_v3", False),
             "ep_deepseek_v3_lora": lambda: run("deepseek_v3", True),
             # 4 ranks: fsdp=4 x ep=2, the experts sharded by FSDP2 over the 2 ranks holding the same ones
             "fsdp4_ep2_qwen3_5_moe_full": lambda: run("qwen3_5_moe", False, ep=2),
             "fsdp4_ep2_deepseek_v3_lora": lambda: run("deepseek_v3", True, ep=2)}


def main() -> None:
    import torch.distributed as dist

    import twinkle

    out, names = Path(sys.argv[1]), sys.argv[2:]
    twinkle.initialize(seed=0, timeout_s=120)
    rank = dist.get_rank()
    for name in names:
        try:
            result = SCENARIOS[name]()
        except Exception:
            (out / f"{name}.rank{rank}.error").write_text(traceback.format_exc())
            raise
        torch.save(result, out / f"{name}.rank{rank}.pt")


if __name__ == "__main__":
    main()
