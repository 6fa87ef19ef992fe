"""Fixtures for the data-path tests: offline hubs, the embedded tokenizer, and a tokenizer built here."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

_CACHE = tempfile.mkdtemp(prefix="twinkle-data-tests-")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
os.environ.setdefault("HF_DATASETS_CACHE", _CACHE)  # before `datasets` is imported: keep the user's cache clean
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402

from twinkle.template import Template  # noqa: E402

# A Llama-3-style chat template without {% generation %} markers: exercises the prefix-render path.
LLAMA_STYLE_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + "
    "'<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}"
)

CORPUS = [
    "the cat sat on the mat", "a dog runs in the park", "hello world how are you", "I am fine thank you",
    "what is two plus two", "two plus two is four", "tell me a story about a fox", "once upon a time",
    "训练数据很重要", "你好世界", "我很好谢谢", "今天天气不错",
]


def build_test_tokenizer():
    """A byte-level BPE trained here on CORPUS, with Llama-3 special tokens and LLAMA_STYLE_TEMPLATE."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok = Tokenizer(models.BPE())
    split = r"""[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS * 3, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|end_of_text|>",
        chat_template=LLAMA_STYLE_TEMPLATE,
    )


@pytest.fixture(scope="session")
def embedded_template() -> Template:
    """The generic Template over twinkle's embedded tokenizer (loaded once)."""
    template = Template()
    _ = template.tokenizer
    return template


@pytest.fixture(scope="session")
def tokenizer(embedded_template):
    return embedded_template.tokenizer


@pytest.fixture(scope="session")
def test_tokenizer():
    return build_test_tokenizer()


@pytest.fixture
def multi_turn() -> list[dict]:
    return [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "What is two plus two?"},
        {"role": "assistant", "content": "Two plus two is four."},
        {"role": "user", "content": "你好，你是谁？"},
        {"role": "assistant", "content": "我是twinkle大模型，很高兴认识你。"},
        {"role": "user", "content": "Tell me a story about a fox."},
        {"role": "assistant", "content": "Once upon a time, a fox sat on the mat."},
    ]


@pytest.fixture
def twinkle_log(caplog):
    """caplog, attached to twinkle's logger (which does not propagate to the root logger)."""
    import logging

    from twinkle.log import get_logger

    logger = get_logger("twinkle")
    logger.addHandler(caplog.handler)
    caplog.handler.setLevel(logging.WARNING)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
