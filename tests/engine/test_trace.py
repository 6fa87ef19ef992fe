"""A reader follows one ``forward_backward`` + ``clip_grad_and_step`` in a few hops (issue 22).

Each of the four model classes runs one LoRA step (after a warm-up step, so one-time set-up is
not counted) under ``sys.setprofile``; the twinkle source files its Python frames enter are listed.
The bound is 10 per model class; before the engine existed it was 22-29.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from peft import LoraConfig

PACKAGES = str(Path(__file__).resolve().parents[2] / "packages")
LIMIT = 10


def _config() -> object:
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=128, max_position_embeddings=64,
                       tie_word_embeddings=False, pad_token_id=0)


def _batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 128, (2, 12), generator=gen)
    labels = ids.clone()
    labels[:, :3] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def _lora() -> LoraConfig:
    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj"])


def _files_entered(step: Callable[[], None]) -> list[str]:
    step()  # warm-up: optimizer state, caches, lazy imports
    files: set[str] = set()

    def profile(frame, event, arg):  # noqa: ANN001
        if event == "call" and frame.f_code.co_filename.startswith(PACKAGES):
            files.add(frame.f_code.co_filename.split("/src/", 1)[1])

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    return sorted(files)


def _single(cls_name: str, **kwargs: object) -> Callable[[], None]:
    import twinkle.model

    torch.manual_seed(0)
    model = getattr(twinkle.model, cls_name)(config=_config(), mixed_precision="no", **kwargs)
    model.add_adapter_to_model("a", _lora())
    model.set_optimizer("default", lr=1e-3)
    return lambda: (model.forward_backward(_batch()), model.clip_grad_and_step())


def _multi(cls_name: str, **kwargs: object) -> Callable[[], None]:
    import twinkle.model

    torch.manual_seed(0)
    model = getattr(twinkle.model, cls_name)(config=_config(), mixed_precision="no", max_loras=2, max_r=8, **kwargs)
    model.acquire_lora("t", _lora())
    model.set_optimizer("default", lr=1e-3, adapter_name="t")
    return lambda: (model.forward_backward(_batch(), adapter_name="t"), model.clip_grad_and_step(adapter_name="t"))


CASES = {
    "TransformersModel": lambda: _single("TransformersModel"),
    "MultiLoraTransformersModel": lambda: _multi("MultiLoraTransformersModel"),
    "MegatronModel": lambda: _single("MegatronModel", seed=0),
    "MultiLoraMegatronModel": lambda: _multi("MultiLoraMegatronModel", seed=0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_one_step_enters_few_files(name: str) -> None:
    files = _files_entered(CASES[name]())
    assert any(f.startswith("twinkle/engine/") for f in files), files  # the step really ran through the engine
    assert len(files) <= LIMIT, f"{name}: one forward_backward + clip_grad_and_step enters {len(files)} files: {files}"
