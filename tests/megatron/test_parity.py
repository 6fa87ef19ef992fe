"""Logits of MegatronModel (TP=1, converted weights) against the HF model they came from.

Tolerance: max |difference| <= 2e-5 in fp32 (measured ~2e-7; the kernels differ in summation order).
Padding and packing are expressed in megatron's attention mask; rotary embeddings depend only on
distances, so left padding and packed rows must reproduce HF's per-sequence logits too.
"""

from __future__ import annotations

import pytest
import torch
from megatron_testing import FAMILIES, VOCAB, hf_model, make_batch, megatron_model, save_hf

ATOL = 2e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_hf_on_a_right_padded_batch(family, tmp_path):
    hf = hf_model(family)
    model = megatron_model(save_hf(hf, tmp_path))
    batch = make_batch(seed=1, rows=3, length=11)
    logits = model.forward_only(inputs=batch)["logits"]
    with torch.no_grad():
        ref = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    real = batch["attention_mask"].bool()
    assert logits.shape == ref.shape == (3, 11, VOCAB)
    assert (logits[real] - ref[real]).abs().max() <= ATOL


def test_left_padding_and_packing_give_each_sequence_its_own_logits(tmp_path):
    hf = hf_model("mistral")  # sliding window 5 < sequence lengths: the window must follow the sequence too
    model = megatron_model(save_hf(hf, tmp_path))
    seqs = [torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (9, 6)]
    with torch.no_grad():
        refs = [hf(input_ids=s[None]).logits[0] for s in seqs]

    left = {"input_ids": torch.stack([seqs[0], torch.cat([torch.zeros(3, dtype=torch.long), seqs[1]])]),
            "attention_mask": torch.tensor([[1] * 9, [0] * 3 + [1] * 6])}
    logits = model.forward_only(inputs=left)["logits"]
    assert (logits[0] - refs[0]).abs().max() <= ATOL
    assert (logits[1, 3:] - refs[1]).abs().max() <= ATOL

    packed = {"input_ids": torch.cat(seqs)[None], "position_ids": torch.cat([torch.arange(9), torch.arange(6)])[None]}
    logits = model.forward_only(inputs=packed)["logits"][0]
    assert (logits[:9] - refs[0]).abs().max() <= ATOL
    assert (logits[9:] - refs[1]).abs().max() <= ATOL


def test_megatron_model_is_not_just_the_hf_model(tmp_path):
    """The comparison above can fail: a different checkpoint gives different logits."""
    model = megatron_model(save_hf(hf_model("qwen2", seed=0), tmp_path))
    other = hf_model("qwen2", seed=1)
    ids = make_batch(seed=2, ragged=False)["input_ids"]
    with torch.no_grad():
        assert (model.forward_only(inputs={"input_ids": ids})["logits"] - other(input_ids=ids).logits).abs().max() > 0.1
