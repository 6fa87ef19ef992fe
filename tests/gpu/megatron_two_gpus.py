"""Run by test_megatron_gpu.py under ``torchrun --nproc_per_node=2`` on two GPUs: TP=2 or CP=2 training.

argv: <hf dir> <tp2|cp2> <output dir>. Rank 0 writes rank0.json: the loss, grad norm of each step.
``steps`` is also the single-GPU reference the test runs in its own process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

STEPS = 3
#: TP=2 vs TP=1 compares float32 runs within a derived bound: Adam's eps 1 keeps its update Lipschitz in the
#: gradient (eps 1e-8 turns summation-order noise in near-zero gradients into lr-sized weight differences)
TP2_ADAM_EPS = 1.0


def steps(m, adam_eps: float = 1e-8) -> list[dict]:
    """STEPS optimizer steps through the schedule (TP and CP ranks all read the whole batch)."""
    from test_megatron_gpu import batch

    m.set_optimizer("default", lr=1e-3, adam_eps=adam_eps)
    out = []
    for step in range(STEPS):
        m.forward_backward(inputs=batch(seed=200 + step, length=64), num_microbatches=2)
        m.clip_grad_and_step(1.0)
        metrics = m.calculate_metric(True)
        out.append({"loss": metrics["loss"], "grad_norm": metrics["grad_norm"]})
    return out


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import torch

    import twinkle
    from twinkle import DeviceMesh
    from twinkle.model import MegatronModel

    path, layout, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    torch.backends.cuda.matmul.allow_tf32 = False
    mesh = DeviceMesh.from_sizes(tp_size=2) if layout == "tp2" else DeviceMesh.from_sizes(cp_size=2)
    runtime = twinkle.initialize(global_device_mesh=mesh, seed=0)
    m = MegatronModel(model_id=str(path), device_mesh=mesh, mixed_precision="no" if layout == "tp2" else "bf16")
    report = steps(m, adam_eps=TP2_ADAM_EPS) if layout == "tp2" else steps(m)
    if runtime.rank == 0:
        (out / "rank0.json").write_text(json.dumps(report))
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
