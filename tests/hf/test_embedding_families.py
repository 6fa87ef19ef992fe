"""Seed 001's embedding families trained with InfoNCE: Qwen3-Embedding (LoRA) and GTE (full), each pooled its own way.

Each family is a tiny model of its real architecture written as the hub ships it: Qwen3-Embedding a
``Qwen3Model`` whose sentence-transformers files say last-token pooling (the ``<|endoftext|>`` its
tokenizer appends, left padding), GTE (``thenlper/gte-*-zh``) a ``BertModel`` with a WordPiece
vocabulary whose files say ``[CLS]`` pooling. On a retrieval set made in code (a query per animal,
its document among every animal's), recall@1 rises with training; the checkpoint loads in plain
transformers (+ peft) and, pooled the family's way by code written here, gives twinkle's embeddings.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from peft import LoraConfig, PeftModel
from rounding import LORA_TERMS, tiny_hf, within
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel, BertTokenizerFast, Qwen3Config, Qwen3Model

from twinkle.assets import asset_path
from twinkle_hf.model.tasks import read_pooling_config

#: the tiny encoders (hidden 64, MLP 128, 2 layers, a LoRA of rank <= 16) in another summation order: float32's
#: forward bound for up to 12 texts of 32 tokens (tests/rounding.py), elementwise as rounding.within scales it
FWD = tiny_hf(32, 12, extra=LORA_TERMS).forward_bound()

ANIMALS = ["cat", "dog", "cow", "fox", "owl", "bee", "ant", "pig", "hen", "rat", "bat", "elk"]
FOODS = ["fish", "bones", "grass", "mice", "moths", "nectar", "sugar", "corn", "seeds", "cheese", "fruit", "bark"]
QUERIES = [f"what does the {a} eat" for a in ANIMALS]
DOCS = [f"the {a} eats {f} every day" for a, f in zip(ANIMALS, FOODS)]
QWEN3_INSTRUCT = "Instruct: find the answer\nQuery:"


def _sentence_transformers_files(directory: Path, hidden: int, mode: str) -> None:
    """modules.json + 1_Pooling/config.json as sentence-transformers writes them (the hub repos carry these)."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]
    (directory / "modules.json").write_text(json.dumps(modules))
    (directory / "1_Pooling").mkdir()
    flags = {f"pooling_mode_{m}": m == mode for m in ("cls_token", "mean_tokens", "max_tokens", "lasttoken")}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": hidden, **flags}))


@pytest.fixture(scope="module")
def qwen3_embedding(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-qwen3-embedding")
    tokenizer = AutoTokenizer.from_pretrained(asset_path("tiny-qwen"))
    tokenizer.padding_side = "left"  # as Qwen3-Embedding's usage pads
    config = Qwen3Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    Qwen3Model(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    _sentence_transformers_files(directory, 64, "lasttoken")
    return directory


@pytest.fixture(scope="module")
def gte(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-gte")
    words = sorted({w for text in QUERIES + DOCS for w in text.split()})
    tokenizer = BertTokenizerFast(vocab={w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                                      *words])})
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)  # no dropout: a few steps learn the set
    torch.manual_seed(0)
    BertModel(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    _sentence_transformers_files(directory, 64, "cls_token")
    return directory


def _encoder(directory: Path, family: str):
    """texts -> a padded batch as the family's tokenizer makes it (Qwen3-Embedding: instruction on queries,
    <|endoftext|> appended, left padding)."""
    tokenizer = AutoTokenizer.from_pretrained(directory)

    def encode(texts: list[str], queries: bool = False) -> dict[str, torch.Tensor]:
        if family == "gte":
            return dict(tokenizer(texts, padding=True, return_tensors="pt"))
        eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
        rows = [tokenizer((QWEN3_INSTRUCT if queries else "") + t)["input_ids"] + [eos] for t in texts]
        width = max(map(len, rows))
        pad = tokenizer.pad_token_id
        return {"input_ids": torch.tensor([[pad] * (width - len(r)) + r for r in rows]),
                "attention_mask": torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])}

    return encode


def _family_pooling(hidden: torch.Tensor, mask: torch.Tensor, family: str) -> torch.Tensor:
    """Each family's published pooling, written out: GTE-zh the [CLS] state; Qwen3-Embedding's last_token_pool."""
    if family == "gte":
        return hidden[:, 0]
    if bool((mask[:, -1] == 1).all()):  # left padding: the last position
        return hidden[:, -1]
    return hidden[torch.arange(hidden.shape[0]), mask.sum(dim=1) - 1]


def _recall_at_1(model, encode) -> float:
    def embed(batch: dict) -> torch.Tensor:
        return F.normalize(model.forward_only(inputs=batch, task="embedding")["embeddings"], dim=-1)

    with torch.no_grad():
        q, d = embed(encode(QUERIES, queries=True)), embed(encode(DOCS))
    return float(((q @ d.T).argmax(dim=1) == torch.arange(len(QUERIES))).float().mean())


def _train(model, encode, steps: int, left: bool) -> None:
    """``steps`` InfoNCE steps on every (query, document) pair at once: 11 in-batch negatives per query."""
    batch = _interleave(encode(QUERIES, queries=True), encode(DOCS), left)
    for _ in range(steps):
        model.forward_backward(inputs=batch, task="embedding")
        model.clip_grad_and_step()


def _interleave(queries: dict, docs: dict, left: bool) -> dict:
    """Rows query_0, doc_0, query_1, doc_1, ... padded to one width on the side the family pads."""
    width = max(queries["input_ids"].shape[1], docs["input_ids"].shape[1])

    def widen(t: torch.Tensor) -> torch.Tensor:
        pad = (width - t.shape[1], 0) if left else (0, width - t.shape[1])
        return F.pad(t, pad)

    out = {}
    for key in ("input_ids", "attention_mask"):
        q, d = widen(queries[key]), widen(docs[key])
        out[key] = torch.stack([q, d], dim=1).reshape(-1, width)
    return out


def test_each_family_names_its_pooling(qwen3_embedding, gte, tmp_path):
    assert read_pooling_config(qwen3_embedding) == "last" and read_pooling_config(gte) == "cls"
    assert read_pooling_config(tmp_path) is None
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(ValueError, match="pools with .'pooling_mode_max_tokens'.*pooling="):
        read_pooling_config(tmp_path)


def test_gte_trains_with_infonce_and_loads_in_plain_transformers(gte, tmp_path):
    from twinkle.model import TransformersModel

    encode = _encoder(gte, "gte")
    model = TransformersModel(model_cls="AutoModel", model_id=str(gte), mixed_precision="no")
    model.set_loss("InfoNCELoss", temperature=0.1)
    model.set_optimizer("AdamW", lr=2e-3)
    batch = encode(DOCS[:3])
    out = model.forward_only(inputs=batch, task="embedding")
    torch.testing.assert_close(out["embeddings"], out["last_hidden_state"][:, 0], rtol=0, atol=0)  # GTE-zh: [CLS]
    before = _recall_at_1(model, encode)
    _train(model, encode, steps=12, left=False)
    after = _recall_at_1(model, encode)
    assert before <= 0.35 and after >= 0.9, (before, after)

    path = model.save("final", output_dir=str(tmp_path))
    plain = AutoModel.from_pretrained(path).eval()
    batch = encode(QUERIES)
    with torch.no_grad():
        expected = _family_pooling(plain(**batch).last_hidden_state, batch["attention_mask"], "gte")
        got = model.forward_only(inputs=batch, task="embedding")["embeddings"]
    torch.testing.assert_close(got, expected, **within(FWD, expected))


def test_qwen3_embedding_trains_a_lora_with_infonce_and_loads_in_peft(qwen3_embedding, tmp_path):
    from twinkle.model import TransformersModel

    encode = _encoder(qwen3_embedding, "qwen3")
    torch.manual_seed(1)
    model = TransformersModel(model_cls="AutoModel", model_id=str(qwen3_embedding), mixed_precision="no")
    model.add_adapter_to_model("emb", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    model.set_loss("InfoNCELoss", temperature=0.1)
    model.set_optimizer("AdamW", lr=3e-3)
    batch = encode(DOCS[:3])
    out = model.forward_only(inputs=batch, task="embedding")
    torch.testing.assert_close(out["embeddings"], out["last_hidden_state"][:, -1], rtol=0, atol=0)  # left padded: eos
    before = _recall_at_1(model, encode)
    _train(model, encode, steps=15, left=True)
    after = _recall_at_1(model, encode)
    assert before <= 0.35 and after >= 0.9, (before, after)

    path = model.save("final", output_dir=str(tmp_path))
    plain = PeftModel.from_pretrained(AutoModel.from_pretrained(qwen3_embedding), path).eval()
    batch = encode(QUERIES, queries=True)
    with torch.no_grad():
        expected = _family_pooling(plain(**batch).last_hidden_state, batch["attention_mask"], "qwen3")
        got = model.forward_only(inputs=batch, task="embedding")["embeddings"]
    torch.testing.assert_close(got, expected, **within(FWD, expected))
