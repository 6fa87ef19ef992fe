"""rotary_embedding / attention kernels: the helper a forward calls is rebound for that instance only."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from rounding import tiny_hf, within

from twinkle.kernel import KernelChoice, KernelNotApplicable, kernel_report, kernelize, unkernelize
from twinkle.kernel.probes import reference_rotary

calls = {"rotary": 0, "attention": 0, "declined": 0}


def counted_rotary(q, k, cos, sin, unsqueeze_dim=1):
    calls["rotary"] += 1
    return reference_rotary(q, k, cos, sin, unsqueeze_dim)


def plain_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' attention-interface signature, written out in plain torch."""
    calls["attention"] += 1
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    scores = query @ key.transpose(-1, -2) * scaling
    if attention_mask is None:
        causal = torch.ones(query.shape[2], key.shape[2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
    elif attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    else:
        scores = scores + attention_mask
    out = torch.softmax(scores, dim=-1) @ value
    return out.transpose(1, 2).contiguous(), None


def declining_attention(*args, **kwargs):
    calls["declined"] += 1
    raise KernelNotApplicable("not this call")


ROTARY = KernelChoice("test", "rotary_embedding", devices=("cpu",), function=counted_rotary)
ATTENTION = KernelChoice("test", "attention", devices=("cpu",), function=plain_attention)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_rotary_and_attention_rebound_per_instance(attn, make_model, batch):
    model = make_model("qwen2", attn_implementation=attn)
    twin = copy.deepcopy(model)
    ids = batch["input_ids"][:1]  # no padding: every position is compared
    want = twin(input_ids=ids).logits
    modeling = importlib.import_module(type(model).__module__)
    global_rotary = modeling.apply_rotary_pos_emb

    kernelize(model, {"rope": ROTARY, "attention": ATTENTION})
    assert kernel_report(model).ops["rotary_embedding"].replaced == 2
    assert kernel_report(model).ops["attention"].replaced == 2
    calls.update(rotary=0, attention=0)
    got = model(input_ids=ids).logits
    assert calls == {"rotary": 2, "attention": 2, "declined": 0}
    # reimplemented rotary/attention in fp32: a forward's float32 bound, one row of 10 tokens (tests/rounding.py)
    torch.testing.assert_close(got, want, **within(tiny_hf(10, 1).forward_bound(), want))

    # the library and the other instance are untouched
    assert modeling.apply_rotary_pos_emb is global_rotary
    calls.update(rotary=0, attention=0)
    twin(input_ids=ids)
    assert calls["rotary"] == 0 and calls["attention"] == 0

    unkernelize(model)
    assert not any("forward" in vars(m) for m in model.modules())
    assert torch.equal(model(input_ids=ids).logits, want)


def test_attention_kernel_declining_a_call_runs_the_configured_implementation(make_model, batch):
    model = make_model("llama")
    want = copy.deepcopy(model)(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits
    kernelize(model, {"attention": KernelChoice("test", "attention", devices=("cpu",), function=declining_attention)})
    calls["declined"] = 0
    got = model(**{k: batch[k] for k in ("input_ids", "attention_mask")}).logits
    assert calls["declined"] == 2
    assert torch.equal(got, want)
    unkernelize(model)
