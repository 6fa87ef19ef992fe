"""Find, in a rendered conversation, the characters each assistant turn trains on.

Two ways, same answer (the tests check both on one tokenizer):

1. The chat template marks assistant output with ``{% generation %}`` (twinkle's embedded
   template does): one render yields the spans. This is the fast path.
2. Any other template: render prefixes. Turn *i* starts where ``render(messages[:i],
   add_generation_prompt=True)`` stops agreeing with the whole conversation, and ends where
   ``render(messages[:i+1])`` ends (trailing whitespace after the end-of-turn token is not
   trained). Templates that re-render history differently (Qwen3 drops old reasoning) fall back
   to locating the turn's content after its start, plus the end-of-turn token.

A span is ``(start, end)`` in characters of the rendered text; one span per assistant message.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from twinkle.dataset.errors import DataError

Span = tuple[int, int]
Renderer = Callable[[list[list[dict[str, Any]]], bool], list[str]]

_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")


@dataclass
class Conversation:
    """Messages ready for a chat template (None-valued keys removed), their tool schemas, and each
    assistant message's ``loss`` override (None: follow the template's ``train_turns``)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    loss_flags: list[bool | None] = field(default_factory=list)

    @property
    def assistant_indices(self) -> list[int]:
        return [i for i, m in enumerate(self.messages) if m["role"] == "assistant"]


def has_generation_markers(chat_template: str) -> bool:
    return bool(_GENERATION_TAG.search(chat_template))


def spans_from_markers(
    conversations: Sequence[Conversation], chat_template: str, template_kwargs: dict[str, Any]
) -> list[tuple[str, list[Span]] | None]:
    """Render with ``{% generation %}`` tracking; None for a conversation whose blocks do not match its turns."""
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:  # older transformers: the prefix path handles every template
        return [None] * len(conversations)
    results: list[tuple[str, list[Span]] | None] = [None] * len(conversations)
    groups: dict[str, list[int]] = {}
    for k, conv in enumerate(conversations):  # one render call per distinct tools list
        groups.setdefault(json.dumps(conv.tools, sort_keys=True) if conv.tools else "", []).append(k)
    for members in groups.values():
        tools = conversations[members[0]].tools
        texts, indices = render_jinja_template(
            conversations=[conversations[k].messages for k in members], tools=tools, chat_template=chat_template,
            return_assistant_tokens_mask=True, add_generation_prompt=False, **template_kwargs,
        )
        for k, text, spans in zip(members, texts, indices):
            if len(spans) == len(conversations[k].assistant_indices):
                results[k] = (text, [(int(s), int(e)) for s, e in spans])
    return results


def spans_from_prefixes(conv: Conversation, render: Renderer, turn_end: str | None) -> tuple[str, list[Span]]:
    """Spans of one conversation by rendering its prefixes (see the module docstring)."""
    msgs = conv.messages
    turns = conv.assistant_indices
    closed = render([msgs] + [msgs[: i + 1] for i in turns], False)
    full, through = closed[0], closed[1:]
    opened = render([msgs[:i] for i in turns], True)
    spans: list[Span] = []
    for n, i in enumerate(turns):
        start = _common_prefix(opened[n], full)
        if full.startswith(through[n]):
            end = max(start, len(through[n].rstrip()))
        else:
            end = _locate_content(full, start, msgs[i]["content"], turn_end, i)
        if spans and start < spans[-1][1]:
            raise DataError(f"the chat template renders assistant message {i} overlapping the previous one.")
        spans.append((start, end))
    return full, spans


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _locate_content(full: str, start: int, content: str, turn_end: str | None, index: int) -> int:
    """End of the reply that starts at ``start``: its content (or, for templates that strip inline
    reasoning from history, the part after ``</think>``), plus the end-of-turn token."""
    pos, needle = -1, ""
    for needle in dict.fromkeys((content.strip(), content.rsplit("</think>", 1)[-1].strip())):
        pos = full.find(needle, start) if needle else start
        if pos >= 0:
            break
    if pos < 0:
        raise DataError(
            f"could not find assistant message {index} in the rendered conversation (the chat template rewrites it). "
            "Use a chat template with {% generation %} markers: Template(chat_template=...)."
        )
    end = pos + len(needle)
    if turn_end and full.startswith(turn_end, end):
        end += len(turn_end)
    return end
