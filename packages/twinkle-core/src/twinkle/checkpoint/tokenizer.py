"""The tokenizer (and its chat template) inside a checkpoint, so the directory is self-contained.

A checkpoint that ``AutoTokenizer.from_pretrained`` (a VL one: ``AutoProcessor``) can read next to
the weights lets users load and chat with it in plain transformers. It comes from the group's
template when it has one (what the data was encoded with; a VL template writes its processor),
else the tokenizer and processor files of the model's own source directory are copied.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_tokenizer(directory: str | Path, template: Any = None, source_dir: str | Path | None = None) -> bool:
    """Write the template's tokenizer/processor, else copy those of ``source_dir``; True if one was written."""
    if template is not None and hasattr(template, "save_pretrained"):
        template.save_pretrained(directory)
        return True
    tokenizer = getattr(template, "tokenizer", None)
    if tokenizer is not None and hasattr(tokenizer, "save_pretrained"):
        tokenizer.save_pretrained(str(directory))
        return True
    if source_dir is None:
        return False
    from twinkle.multimodal.processor import copy_missing_files

    return bool(copy_missing_files(source_dir, directory))
