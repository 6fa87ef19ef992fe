"""Helpers for the twinkle-hf tests: tiny models built from configs, batches, state hashes.

Imported by test modules directly (``from hf_testing import ...``) and by conftest.py.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

VOCAB = 128


def tiny_config(family: str = "qwen2", vocab_size: int = VOCAB, **overrides: Any):
    """A 2-layer, hidden-64 config of one transformers family (qwen2, qwen3, llama, mistral)."""
    import transformers

    classes = {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "llama": "LlamaConfig", "mistral": "MistralConfig"}
    kwargs = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=vocab_size, max_position_embeddings=256,
                  tie_word_embeddings=False, pad_token_id=0)
    if family == "qwen3":
        kwargs["head_dim"] = 16
    kwargs.update(overrides)
    return getattr(transformers, classes[family])(**kwargs)


def make_model(family: str = "qwen2", seed: int = 0, mixed_precision: str = "no", **kwargs: Any):
    """A TransformersModel over a freshly (seeded) initialised tiny model."""
    from twinkle.model import TransformersModel

    torch.manual_seed(seed)
    config = kwargs.pop("config", None) or tiny_config(family)
    return TransformersModel(config=config, mixed_precision=mixed_precision, **kwargs)


def make_batch(seed: int, rows: int = 4, length: int = 12, vocab: int = VOCAB, pad_to: int | None = None,
               prompt: int = 3) -> dict[str, torch.Tensor]:
    """Right-padded random token rows of varied lengths; the first ``prompt`` labels of each row are -100."""
    gen = torch.Generator().manual_seed(seed)
    width = pad_to or length
    input_ids = torch.zeros(rows, width, dtype=torch.long)
    attention_mask = torch.zeros(rows, width, dtype=torch.long)
    labels = torch.full((rows, width), -100, dtype=torch.long)
    for r in range(rows):
        n = int(torch.randint(prompt + 2, length + 1, (1,), generator=gen))
        ids = torch.randint(3, vocab, (n,), generator=gen)
        input_ids[r, :n] = ids
        attention_mask[r, :n] = 1
        labels[r, prompt:n] = ids[prompt:]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def concat_batches(batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Stack batches padded to the longest one (pad 0, labels -100)."""
    width = max(b["input_ids"].shape[1] for b in batches)
    out: dict[str, list[torch.Tensor]] = {"input_ids": [], "attention_mask": [], "labels": []}
    for b in batches:
        extra = width - b["input_ids"].shape[1]
        for key, fill in (("input_ids", 0), ("attention_mask", 0), ("labels", -100)):
            out[key].append(torch.nn.functional.pad(b[key], (0, extra), value=fill))
    return {k: torch.cat(v) for k, v in out.items()}


def tensor_hash(tensors: Any) -> str:
    """A digest of every tensor in a (nested) dict/list, in order."""
    digest = hashlib.sha256()

    def walk(obj: Any) -> None:
        if isinstance(obj, torch.Tensor):
            digest.update(obj.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                          if obj.numel() else b"")
            digest.update(str((obj.dtype, tuple(obj.shape))).encode())
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                digest.update(str(k).encode())
                walk(obj[k])
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                walk(item)
        else:
            digest.update(repr(obj).encode())

    walk(tensors)
    return digest.hexdigest()


def model_state_hash(model: Any) -> str:
    """Weights, every group's optimizer/scheduler state and progress counters."""
    parts: dict[str, Any] = {"weights": dict(model.model.state_dict()), "groups": list(model.optimizer_group)}
    for name, group in model.optimizer_group.items():
        parts[f"{name}.opt"] = group.optimizer.state_dict() if group.optimizer is not None else None
        parts[f"{name}.sched"] = group.lr_scheduler.state_dict() if group.lr_scheduler is not None else None
        parts[f"{name}.progress"] = (group.cur_step, group.micro_step, group.gradient_accumulation_steps)
    return tensor_hash(parts)


def status_mb(field: str) -> float:
    """``/proc/self/status``'s ``field`` (VmRSS, VmHWM) in MiB (Linux)."""
    from pathlib import Path

    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return 0.0


def reset_peak_rss() -> float:
    """Freed memory back to the OS (malloc_trim) and the kernel's high-water mark reset (clear_refs 5), so that
    VmHWM read later is the peak from here on; returns the RSS now (MiB)."""
    import ctypes
    import gc
    from pathlib import Path

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
    return status_mb("VmRSS")
