"""A transformers model's full weights for an inference engine, in bounded buckets of the engine's dtype.

A full-weight sync used to gather the whole state dict as fp32 host tensors on every rank and hand it
to vLLM in one piece: ~32 GB per sync for an 8B model, twice what the bf16 engine holds. Here each
tensor is gathered on its own (``full_tensor``: every rank of a sharded model takes part, in the same
order), cast to the engine's dtype on the device, copied to the host and collected into buckets of at
most ``bucket_bytes`` (a tensor larger than that is a bucket of its own); the caller hands each bucket
to the engine before the next is built, so a rank holds one bucket at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from twinkle import collective

#: bytes per bucket handed to the engine at once (one pickled apply_model call under vLLM's engine process)
DEFAULT_BUCKET_BYTES = 1 << 30


def weight_buckets(hf_model: torch.nn.Module, dtype: torch.dtype | None = None,
                   bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """``(HF name, host tensor)`` lists of at most ``bucket_bytes`` each (see the module docstring).

    Args:
        hf_model: the transformers model (FSDP2-sharded or not); every rank must iterate to the end.
        dtype: what the engine holds (floating tensors are cast to it on the device); None keeps each dtype.
        bucket_bytes: the most bytes of one bucket (a larger tensor goes alone).

    Returns:
        An iterator of buckets; the tensors are copies, safe to keep while training goes on.
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes}: a bucket needs room for at least one byte.")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, value in hf_model.state_dict().items():
        tensor = collective.full_tensor(value.detach())
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        tensor = tensor.to("cpu", copy=True).contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def engine_dtype(engine: Any) -> torch.dtype | None:
    """The dtype a vLLM engine holds its weights in (``llm_engine.model_config.dtype``), None when it says none."""
    config = getattr(getattr(engine, "llm_engine", None), "model_config", None)
    dtype = getattr(config, "dtype", None)
    return dtype if isinstance(dtype, torch.dtype) else None
