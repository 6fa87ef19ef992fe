"""The training loop an ML engineer writes by hand, timed: the reference the benchmarks compare twinkle with.

Imported by ``bench_lora_step.py`` (CPU or GPU, any precision) and ``bench_gpu_train.py`` (bf16 on a
GPU), so both measure the same loop.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any


def timed_steps(model: Any, batch: dict[str, Any], steps: int, device: str, dtype: Any, lr: float,
                losses: list[float]) -> list[float]:
    """Seconds per step of autocast forward, backward, clipping at 1.0 and AdamW over the trainable
    parameters; each step's loss is appended to ``losses`` (one ``.item()`` per step, as users write)."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    batch = {k: v.to(device) for k, v in batch.items()}
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        with torch.autocast(device, dtype=dtype) if dtype is not None else contextlib.nullcontext():
            loss = model(**batch, use_cache=False).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return times
