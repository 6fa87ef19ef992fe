"""torchrun job (2 CPU ranks, DDP): every RL and preference loss's LoRA gradient on each rank's share of one batch.

Usage: torchrun --nproc_per_node=2 dp_job.py OUT_DIR; ``run()`` in one process on the whole batch is the
reference. Writes OUT_DIR/rl_dp.rank<r>.pt (or .error with the traceback).
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hf"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_testing import tiny_config  # noqa: E402

#: loss name, options, kind of rows
CASES = [("cross_entropy", {}, "rollouts"), ("importance_sampling", {}, "rollouts"), ("ppo", {}, "rollouts"),
         ("cispo", {}, "rollouts"), ("dro", {"beta": 0.3}, "rollouts"), ("grpo", {"beta": 0.2}, "rollouts"),
         ("bnpo", {}, "rollouts"), ("dr_grpo", {"max_tokens": 8}, "rollouts"),
         ("gspo", {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}, "rollouts"),
         ("dpo", {"beta": 0.5}, "pairs"), ("ipo", {"beta": 0.5}, "pairs"), ("simpo", {}, "pairs"),
         ("orpo", {}, "pairs")]


def rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def make_rows(kind: str, seed: int = 0) -> list[list[dict]]:
    """Units that stay on one rank: single rollouts, or (chosen, rejected) pairs."""
    from rl_testing import make_pairs, make_rollouts

    if kind == "rollouts":
        return [[row] for row in make_rollouts(seed, count=6)]
    rows = make_pairs(seed, count=4)
    return [rows[k:k + 2] for k in range(0, len(rows), 2)]


def run() -> dict[str, dict[str, torch.Tensor]]:
    from peft import LoraConfig

    from twinkle import DeviceMesh
    from twinkle.model import TransformersModel

    rank, world = rank_world()
    torch.manual_seed(0)
    model = TransformersModel(config=tiny_config(), mixed_precision="no", strategy="native_fsdp",
                              device_mesh=DeviceMesh.from_sizes(world_size=world))
    torch.manual_seed(1)
    model.add_adapter_to_model("policy", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                                                    init_lora_weights=False))
    model.set_optimizer("SGD", lr=0.0, adapter_name="policy")
    grads: dict[str, dict[str, torch.Tensor]] = {}
    for name, options, kind in CASES:
        units = make_rows(kind)
        mine = [row for unit in units[rank::world] for row in unit]
        model.set_loss(name, adapter_name="policy", **options)
        model.forward_backward(inputs=mine, adapter_name="policy")
        grads[name] = {n: p.grad.detach().clone() for n, p in model.model.named_parameters()
                       if p.grad is not None and "lora_" in n}
        model.clip_grad_and_step(max_grad_norm=1e9, adapter_name="policy")  # lr 0: only clears the gradients
    return grads


def main() -> None:
    import twinkle

    out = Path(sys.argv[1])
    twinkle.initialize(seed=0, timeout_s=120)
    rank, _ = rank_world()
    try:
        torch.save(run(), out / f"rl_dp.rank{rank}.pt")
    except Exception:
        (out / f"rl_dp.rank{rank}.error").write_text(traceback.format_exc())
        raise


if __name__ == "__main__":
    main()
