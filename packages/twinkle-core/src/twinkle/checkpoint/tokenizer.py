"""The tokenizer (and its chat template) inside a checkpoint, so the directory is self-contained.

A checkpoint that ``AutoTokenizer.from_pretrained`` can read next to the weights lets users load
and chat with it in plain transformers. The tokenizer comes from the group's template when it
has one (the tokenizer the data was encoded with), else from the model's own source directory.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

#: the files transformers' tokenizers read (fast and slow), chat templates included
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "tokenizer.model", "vocab.json", "merges.txt",
                   "vocab.txt")


def save_tokenizer(directory: str | Path, template: Any = None, source_dir: str | Path | None = None) -> bool:
    """Write the template's tokenizer, else copy the tokenizer files of ``source_dir``; True if one was written."""
    tokenizer = getattr(template, "tokenizer", None)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(str(directory))
        return True
    source = Path(source_dir) if source_dir is not None else None
    if source is None or not (source / "tokenizer_config.json").is_file():
        return False
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, Path(directory) / name)
    return True
