"""MegatronModel's CUDA code path run on CPU, in its own process: a *simulation*, not a GPU run.

megatron-core's DDP, DistributedOptimizer, forward-backward schedule, finalize_model_grads and
distributed checkpointing are pure PyTorch apart from hard-coded ``device='cuda'`` allocations and a
``param.type()`` check. This script redirects those to the CPU (``simulate_cuda``), tells the model
it is on CUDA, and runs the scenarios of tests/gpu/run_megatron.sh with fp32 weights. It proves
twinkle's wiring (drivers, schedule, accumulation, dist-checkpoint resume) against megatron's real
classes; kernels, NCCL and bf16/fp8 numerics still need the GPU script.

argv: <qwen2 dir> <output json>. Module-level imports stay stdlib-only: megatron's checkpoint writer starts a
helper process that re-imports this file.
"""

from __future__ import annotations

import functools
import json
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def simulate_cuda() -> None:
    """Send ``device='cuda'`` allocations to the CPU and make CPU tensors pass megatron's CUDA type checks."""
    import torch

    def cpu_device(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if str(kwargs.get("device", "")).startswith("cuda"):
                kwargs["device"] = "cpu"
            return fn(*args, **kwargs)

        return wrapper

    for name in ("tensor", "zeros", "empty", "ones", "full"):
        setattr(torch, name, cpu_device(getattr(torch, name)))
    plain_type = torch.Tensor.type

    def cuda_type(self, *args, **kwargs):
        kind = plain_type(self, *args, **kwargs)
        return kind.replace("torch.", "torch.cuda.", 1) if not args and not kwargs and "cuda" not in kind else kind

    torch.Tensor.type = cuda_type
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.cuda.synchronize = lambda *args, **kwargs: None


def model(path: Path, **kwargs):
    from megatron_testing import megatron_model

    m = megatron_model(path, **kwargs)
    m.device_type = "cuda"  # from here on MegatronModel takes its GPU code path
    return m


def run(m, start: int, steps: int, micro: int = 2, adapter: str | None = None) -> list[float]:
    from megatron_testing import make_batch

    losses = []
    for step in range(start, start + steps):
        losses.append(float(m.forward_backward(inputs=make_batch(seed=100 + step), num_microbatches=micro,
                                               adapter_name=adapter)))
        m.clip_grad_and_step(1.0, adapter_name=adapter)
    return losses


def fresh(path: Path):
    m = model(path)
    m.set_optimizer("default", lr=5e-3, weight_decay=0.01)
    m.set_lr_scheduler("default", lr_warmup_steps=1, lr_decay_steps=6, lr_decay_style="linear")
    return m


def main() -> None:
    from megatron_testing import make_batch

    simulate_cuda()
    path, out = Path(sys.argv[1]), Path(sys.argv[2])
    report = {}

    single = fresh(path)
    report["optimizer_kind"] = single.optimizer_group["default"].optimizer.kind
    report["model_wrapped"] = type(single.model).__name__
    data = make_batch(seed=7)
    losses, norms = [], []
    for micro in (1, 2, 4):
        m = fresh(path)
        losses.append(float(m.forward_backward(inputs=data, num_microbatches=micro)))
        norms.append(m.clip_grad_norm(1.0))
    report["losses_by_microbatches"], report["norms_by_microbatches"] = losses, norms

    report["straight"] = run(fresh(path), 0, 4)
    first = fresh(path)
    head = run(first, 0, 2)
    checkpoint = Path(first.save("step-2", output_dir=str(out.parent), save_optimizer=True))
    report["checkpoint_files"] = sorted(p.name for p in checkpoint.iterdir())
    resumed = fresh(checkpoint)
    report["progress"] = resumed.resume_from_checkpoint(str(checkpoint))
    report["resumed"] = head + run(resumed, 2, 2)

    from peft import LoraConfig

    lora = model(path)
    lora.add_adapter_to_model("a", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    lora.set_optimizer("default", lr=2e-2, adapter_name="a")
    fixed = make_batch(seed=3)
    report["lora_losses"] = []
    for _ in range(6):
        report["lora_losses"].append(float(lora.forward_backward(inputs=fixed, num_microbatches=2)))
        lora.clip_grad_and_step(1.0)
    out.write_text(json.dumps(report))


if __name__ == "__main__":  # megatron's checkpoint writer starts worker processes that re-import this file
    main()
