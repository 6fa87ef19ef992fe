"""Helpers for the server tests: Tinker datums, saved adapters, hashes and the component-API reference."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

TEXTS = [
    "I am twinkle, a training workbench built by the twinkle developers.",
    "You can call me twinkle; I help people train language models.",
    "My name is twinkle and I run on one CPU or on many GPUs.",
    "twinkle trains many LoRA adapters on one shared base model at once.",
]


def sft_datums(tokenizer: Any, texts: list[str] = TEXTS, prompt: int = 3) -> list[Any]:
    """Tinker SFT datums: input = tokens[:-1], targets = tokens[1:], weight 0 on the first ``prompt`` targets."""
    from tinker import types

    datums = []
    for text in texts:
        ids = tokenizer.encode(text)
        weights = [0.0] * prompt + [1.0] * (len(ids) - 1 - prompt)
        datums.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                                  loss_fn_inputs={"target_tokens": ids[1:], "weights": weights}))
    return datums


def rows(datums: list[Any]) -> list[dict[str, list]]:
    """The same datums as twinkle rows (what a training script feeds forward_backward)."""
    out = []
    for datum in datums:
        row = {"input_ids": datum.model_input.to_ints()}
        for name, tensor in datum.loss_fn_inputs.items():
            row[name] = tensor.to_numpy().reshape(-1).tolist()
        out.append(row)
    return out


def weighted_nll(result: Any, datums: list[Any]) -> float:
    """Tinker's cross_entropy written from its definition, on the returned logprobs: sum(-w * logp)."""
    total = 0.0
    for output, datum in zip(result.loss_fn_outputs, datums, strict=True):
        logprobs = np.asarray(output["logprobs"].data, dtype=np.float64)
        weights = datum.loss_fn_inputs["weights"].to_numpy().astype(np.float64)
        total += float(-(logprobs * weights).sum())
    return total


def adapter_tensors(directory: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(directory / "adapter_model.safetensors"))


def tensors_hash(tensors: dict[str, Any]) -> str:
    digest = hashlib.sha256()
    for key in sorted(tensors):
        digest.update(key.encode())
        digest.update(tensors[key].detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def reference_model(max_r: int = 16, seed: int = 0) -> Any:
    """The component API with the server's base model and seed: what a training script would build."""
    from twinkle.model import MultiLoraTransformersModel
    from twinkle.runtime import seed_everything

    seed_everything(seed)
    from server_proc import ALL_LAYERS, MODEL_ID

    return MultiLoraTransformersModel(model_id=MODEL_ID, mixed_precision="no", max_loras=2, max_r=max_r,
                                      target_modules=ALL_LAYERS)


def train_steps(training: Any, datums: list[Any], steps: int, adam: Any, loss_fn: str = "cross_entropy") -> list[float]:
    """``steps`` x (forward_backward + optim_step) through the client; the reported ``loss:sum`` of each."""
    losses = []
    for _ in range(steps):
        fwd = training.forward_backward(datums, loss_fn)
        opt = training.optim_step(adam)
        losses.append(fwd.result().metrics["loss:sum"])
        opt.result()
    return losses
