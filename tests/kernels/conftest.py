"""Tiny models and a fake Ascend stack (torch_npu written in plain torch) for the kernel tests."""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from twinkle.kernel.probes import rotate_half

os.environ.setdefault("HF_HUB_OFFLINE", "1")
VOCAB = 96


def _tiny(kind: str, **overrides):
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_cls, model_cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[kind]
    kwargs = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64, attention_dropout=0.0)
    kwargs.update(overrides)
    torch.manual_seed(0)
    model = model_cls(config_cls(**kwargs))
    with torch.no_grad():  # non-trivial norm weights, so a wrong RMSNorm formula cannot pass
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    return model.eval()


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one intra-op thread is faster and does not fight the other jobs for the two cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def make_model():
    """make_model('qwen2' | 'llama', **config overrides) -> a seeded 2-layer hidden-64 model."""
    return _tiny


@pytest.fixture
def batch():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, VOCAB, (2, 10), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, :3] = 0  # left padding on the second row
    labels = input_ids.clone()
    labels[:, :4] = -100
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


# ------------------------------------------------------------------ fake torch_npu (plain torch)
def npu_rms_norm(x, gamma, epsilon=1e-6):
    rstd = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + epsilon)
    return (x.float() * rstd).to(x.dtype) * gamma, rstd


def npu_rotary_mul(x, r1, r2):
    return x * r1 + rotate_half(x) * r2


def npu_swiglu(x, dim=-1):
    a, b = x.chunk(2, dim=dim)
    return F.silu(a) * b


def npu_fusion_attention(query, key, value, head_num, input_layout, pse=None, padding_mask=None, atten_mask=None,
                         scale=1.0, keep_prob=1.0, pre_tockens=2147483647, next_tockens=2147483647,
                         inner_precise=0, prefix=None, sparse_mode=0, **kwargs):
    assert input_layout == "BNSD" and query.shape[1] == head_num and keep_prob == 1.0
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scores = query @ key.transpose(-1, -2) * scale
    if atten_mask is not None:
        mask = atten_mask[: query.shape[2], : key.shape[2]] if sparse_mode == 2 else atten_mask
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores.float(), dim=-1).to(query.dtype)
    return (probs @ value, None, None, None, 0, 0, 0)


@pytest.fixture
def fake_npu(monkeypatch):
    """An importable ``torch_npu`` and a ``torch.npu`` that sees one device; records kernel calls."""
    calls: dict[str, int] = {}

    def counted(fn):
        def wrapper(*args, **kwargs):
            calls[fn.__name__] = calls.get(fn.__name__, 0) + 1
            return fn(*args, **kwargs)

        return wrapper

    module = types.ModuleType("torch_npu")
    module.__spec__ = importlib.machinery.ModuleSpec("torch_npu", None)
    for fn in (npu_rms_norm, npu_rotary_mul, npu_swiglu, npu_fusion_attention):
        setattr(module, fn.__name__, counted(fn))
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    monkeypatch.setattr(torch, "npu", types.SimpleNamespace(is_available=lambda: True, device_count=lambda: 1),
                        raising=False)
    return calls
