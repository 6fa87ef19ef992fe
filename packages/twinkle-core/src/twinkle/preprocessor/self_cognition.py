"""SelfCognitionProcessor: the public swift/self-cognition format -> a one-turn conversation."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from twinkle.dataset.errors import DataError
from twinkle.preprocessor.base import Preprocessor
from twinkle.preprocessor.messages import standard_row

_CJK = re.compile(r"[\u4e00-\u9fff]")
NameArg = str | tuple[str, str]
#: upstream Twinkle's system turn for self-cognition rows
DEFAULT_SYSTEM = "You are a helpful assistant."


def _pair(value: NameArg, what: str) -> tuple[str, str]:
    if isinstance(value, str):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(v, str) for v in value):
        return value[0], value[1]
    raise TypeError(f"SelfCognitionProcessor: {what} must be a string or a (chinese, english) pair, got {value!r}.")


class SelfCognitionProcessor(Preprocessor):
    """Fill ``{{NAME}}``/``{{AUTHOR}}`` in ``query``/``response`` rows and emit user/assistant messages.

    ``model_name``/``model_author`` are one string for every row, or a ``(zh, en)`` pair: rows tagged
    ``zh`` get the first, ``en`` the second. A row without a tag counts as zh when its query holds
    Chinese characters.

    Args:
        model_name: the name put in for ``{{NAME}}``.
        model_author: the author put in for ``{{AUTHOR}}``.
        system: the system turn each conversation starts with (upstream Twinkle's default); ``None``
            for none (the chat template's own default then applies).
    """

    def __init__(self, model_name: NameArg = "twinkle", model_author: NameArg = "ModelScope",
                 system: str | None = DEFAULT_SYSTEM) -> None:
        if system is not None and not isinstance(system, str):
            raise TypeError(f"SelfCognitionProcessor: system must be a string or None, got {system!r}.")
        self.names = _pair(model_name, "model_name")
        self.authors = _pair(model_author, "model_author")
        self.system = system

    def preprocess(self, row: Mapping[str, Any]) -> dict[str, Any]:
        query = self.field(row, "query")
        response = self.field(row, "response")
        tag = row.get("tag")
        if tag is None or tag == "":
            tag = "zh" if _CJK.search(query) else "en"
        if tag not in ("zh", "en"):
            raise DataError(f"SelfCognitionProcessor: 'tag' must be 'zh' or 'en', got {tag!r}.")
        k = 0 if tag == "zh" else 1
        name, author = self.names[k], self.authors[k]
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages += [
            {"role": "user", "content": self._fill(query, name, author)},
            {"role": "assistant", "content": self._fill(response, name, author)},
        ]
        return standard_row(messages)

    @staticmethod
    def _fill(text: str, name: str, author: str) -> str:
        return text.replace("{{NAME}}", name).replace("{{AUTHOR}}", author)
