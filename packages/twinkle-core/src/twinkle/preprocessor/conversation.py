"""MessagesProcessor: OpenAI-style ``messages`` or ShareGPT ``conversations`` rows -> the standard format."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twinkle.dataset.errors import DataError, preview
from twinkle.multimodal.media import row_media
from twinkle.preprocessor.base import Preprocessor, missing_fields
from twinkle.preprocessor.messages import standard_row

#: ShareGPT speaker names -> standard roles
SHAREGPT_ROLES = {
    "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
    "system": "system", "observation": "tool", "tool": "tool", "function_call": "assistant",
}


class MessagesProcessor(Preprocessor):
    """Reads ``messages`` (``[{role, content}]``) or ``conversations`` (ShareGPT ``[{from, value}]`` or role/content).

    An optional ``system`` column (or the ``system`` argument, used when a row has none) becomes
    the first turn; an optional ``tools`` column (list or JSON string) is kept. Media come as content
    parts or as ``images``/``image`` and ``videos``/``video`` columns, with ``<image>``/``<video>`` tags.
    """

    def __init__(self, system: str | None = None) -> None:
        self.system = system

    def preprocess(self, row: Mapping[str, Any]) -> dict[str, Any]:
        if row.get("messages") is not None:
            messages = [self._message(m, i) for i, m in enumerate(self._turns(row["messages"], "messages"))]
        elif row.get("conversations") is not None:
            messages = [self._message(m, i) for i, m in enumerate(self._turns(row["conversations"], "conversations"))]
        else:
            raise DataError("MessagesProcessor needs a 'messages' or 'conversations' field, but "
                            f"{missing_fields(row, 'messages', 'conversations')}.")
        system = self.field(row, "system", required=False) or self.system
        if system and not (messages and messages[0]["role"] == "system"):
            messages.insert(0, {"role": "system", "content": system})
        return standard_row(messages, row.get("tools"), *row_media(row))

    @staticmethod
    def _turns(value: Any, name: str) -> list[Any]:
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise DataError(f"MessagesProcessor: {name!r} must be a list of turns, got {preview(value)}.")
        return list(value)

    @staticmethod
    def _message(turn: Any, i: int) -> dict[str, Any]:
        if not isinstance(turn, Mapping):
            raise DataError(f"MessagesProcessor: turn {i} is a {type(turn).__name__}, not a dict: {preview(turn)}.")
        if "from" in turn or "value" in turn:
            speaker = turn.get("from")
            if speaker not in SHAREGPT_ROLES:
                raise DataError(
                    f"MessagesProcessor: turn {i} has from={speaker!r}; known: {', '.join(sorted(SHAREGPT_ROLES))}."
                )
            return {"role": SHAREGPT_ROLES[speaker], "content": turn.get("value"), "loss": turn.get("loss")}
        return {key: turn.get(key) for key in ("role", "content", "reasoning_content", "loss", "tool_calls")}
