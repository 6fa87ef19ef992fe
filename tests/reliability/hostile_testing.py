"""Helpers for the hostile-input tests: a pickle that proves code ran, a tiny trained LoRA model."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any


class Payload:
    """Pickles to a call that creates ``marker``: finding the file proves a checkpoint ran code."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def copy_run(finished: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the ``finished`` run's work dir under ``tmp_path`` and its step-4 checkpoint."""
    import shutil

    wd = tmp_path / "wd"
    shutil.copytree(finished, wd)
    return wd, wd / "checkpoints" / "step-00000004"


def write_payload(path: Path, marker: Path) -> None:
    """Replace ``path`` with a pickle that would create ``marker`` when unpickled."""
    path.write_bytes(pickle.dumps(Payload(marker)))


def lora_model(seed: int = 11, adapters: tuple[str, ...] = ("sft",), lr: float = 1e-2) -> Any:
    """A tiny TransformersModel with LoRA adapters, each with AdamW and a warm-up schedule."""
    from hf_testing import make_model
    from peft import LoraConfig

    model = make_model(seed=seed)
    for name in adapters:
        model.add_adapter_to_model(name, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        model.set_optimizer("AdamW", lr=lr, adapter_name=name)
        model.set_lr_scheduler("CosineWarmupScheduler", num_warmup_steps=1, num_training_steps=8, adapter_name=name)
    return model


def train_step(model: Any, seed: int, adapter_name: str | None = None) -> float:
    from hf_testing import make_batch

    loss = model.forward_backward(inputs=make_batch(seed), adapter_name=adapter_name)
    model.clip_grad_and_step(adapter_name=adapter_name)
    return loss
