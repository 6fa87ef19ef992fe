"""Helpers for the twinkle-megatron tests: tiny HF models of every mapped family, saved checkpoints, batches.

Norm weights and biases are randomised (HF initialises them to 1 and 0, which would hide a
swapped or dropped tensor); the vocabulary size is odd so tensor-parallel vocabulary padding is
exercised.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

VOCAB = 125
FAMILIES = ("qwen2", "qwen3", "llama", "mistral")


def tiny_config(family: str = "qwen2", vocab_size: int = VOCAB, **overrides: Any) -> Any:
    """A 2-layer, hidden-64 transformers config (qwen2, qwen3, llama, mistral, qwen3_moe)."""
    import transformers

    classes = {"qwen2": "Qwen2Config", "qwen3": "Qwen3Config", "llama": "LlamaConfig", "mistral": "MistralConfig",
               "qwen3_moe": "Qwen3MoeConfig"}
    kwargs: dict[str, Any] = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=vocab_size, max_position_embeddings=256,
                                  tie_word_embeddings=False, pad_token_id=0)
    if family in ("qwen3", "qwen3_moe"):
        kwargs["head_dim"] = 16
    if family == "mistral":
        kwargs["sliding_window"] = 5  # shorter than the test sequences: the window matters
    if family == "llama":
        kwargs["attention_bias"] = kwargs["mlp_bias"] = True
    if family == "qwen3_moe":
        kwargs.update(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
    kwargs.update(overrides)
    return getattr(transformers, classes[family])(**kwargs)


def hf_model(family: str = "qwen2", seed: int = 0, **overrides: Any) -> Any:
    """A seeded tiny HF causal LM in fp32 eval mode, with non-trivial norms and biases."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(family, **overrides), dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                param.add_(0.2 * torch.randn_like(param))
    return model.eval()


def save_hf(model: Any, directory: Path) -> Path:
    model.save_pretrained(str(directory))
    return directory


def make_batch(seed: int, rows: int = 4, length: int = 12, vocab: int = VOCAB, prompt: int = 3,
               ragged: bool = True) -> dict[str, torch.Tensor]:
    """Right-padded random rows (ragged lengths unless ``ragged=False``); the first ``prompt`` labels are -100."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.zeros(rows, length, dtype=torch.long)
    attention_mask = torch.zeros(rows, length, dtype=torch.long)
    labels = torch.full((rows, length), -100, dtype=torch.long)
    for r in range(rows):
        n = int(torch.randint(prompt + 2, length + 1, (1,), generator=gen)) if ragged else length
        ids = torch.randint(1, vocab, (n,), generator=gen)
        input_ids[r, :n] = ids
        attention_mask[r, :n] = 1
        labels[r, prompt:n] = ids[prompt:]
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def hf_loss(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """twinkle's CrossEntropyLoss (token mean) on an HF model's logits: the independent reference."""
    from twinkle.loss import CrossEntropyLoss

    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    return CrossEntropyLoss()(batch, {"logits": logits})


def megatron_model(directory: Path | str, **kwargs: Any) -> Any:
    from twinkle.model import MegatronModel

    kwargs.setdefault("mixed_precision", "no")
    return MegatronModel(model_id=str(directory), **kwargs)


def shared_a_adapter(directory: Path, family: str = "qwen2") -> Path:
    """A peft adapter on ``hf_model(family)`` with random B and q/k/v (gate/up) sharing A, as megatron fuses them."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(hf_model(family), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    with torch.no_grad():
        for layer in peft_model.base_model.model.model.layers:
            for shared, others in ((layer.self_attn.q_proj, (layer.self_attn.k_proj, layer.self_attn.v_proj)),
                                   (layer.mlp.gate_proj, (layer.mlp.up_proj,))):
                for other in others:
                    other.lora_A["default"].weight.copy_(shared.lora_A["default"].weight)
            for name, param in layer.named_parameters():
                if "lora_B" in name:
                    param.normal_(std=0.1)
    peft_model.save_pretrained(str(directory))
    return directory
