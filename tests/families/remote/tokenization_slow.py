"""A slow (pure Python) tokenizer shipped as repository code, as GLM-4 and InternLM2 ship theirs.

Test material: ``tests/families`` copies this file into a model directory under the family's file
name (``tokenization_chatglm.py``, ``tokenization_internlm2.py``) with an ``auto_map`` entry, so
``AutoTokenizer.from_pretrained(path, trust_remote_code=True)`` loads a slow tokenizer through
remote code, like the real repositories (whose tokenizers are tiktoken / sentencepiece based; this
one wraps a byte-level BPE from ``tokenizers`` but exposes only the slow-tokenizer interface:
no offsets, special tokens split out by transformers' Python machinery).
"""

from __future__ import annotations

import os
import shutil

from tokenizers import Tokenizer
from transformers import PreTrainedTokenizer


class SlowBPETokenizer(PreTrainedTokenizer):
    vocab_files_names = {"vocab_file": "bpe.json"}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, vocab_file, **kwargs):
        self.vocab_file = vocab_file
        self.bpe = Tokenizer.from_file(vocab_file)
        super().__init__(**kwargs)

    @property
    def vocab_size(self):
        return self.bpe.get_vocab_size(with_added_tokens=False)

    def get_vocab(self):
        vocab = dict(self.bpe.get_vocab(with_added_tokens=False))
        vocab.update(self.added_tokens_encoder)
        return vocab

    def _tokenize(self, text, **kwargs):
        return self.bpe.encode(text, add_special_tokens=False).tokens

    def _convert_token_to_id(self, token):
        return self.bpe.token_to_id(token)

    def _convert_id_to_token(self, index):
        return self.bpe.id_to_token(index)

    def convert_tokens_to_string(self, tokens):
        return self.bpe.decoder.decode(tokens)

    def save_vocabulary(self, save_directory, filename_prefix=None):
        target = os.path.join(save_directory, (filename_prefix + "-" if filename_prefix else "") + "bpe.json")
        if os.path.abspath(self.vocab_file) != os.path.abspath(target):
            shutil.copyfile(self.vocab_file, target)
        return (target,)


class ChatGLM4Tokenizer(SlowBPETokenizer):
    """GLM-4's tokenizer class name (glm-4-9b-chat ships ``tokenization_chatglm.ChatGLM4Tokenizer``)."""


class InternLM2Tokenizer(SlowBPETokenizer):
    """InternLM2's tokenizer class name (internlm2_5-7b-chat ships ``tokenization_internlm2.InternLM2Tokenizer``)."""
