"""The standard conversation format every preprocessor emits and every template reads.

A row is ``{"messages": [{"role", "content", "reasoning_content", "loss", "tool_calls"}, ...],
"tools": str | None}``. ``role`` is system | user | assistant | tool; ``reasoning_content``
(optional) is an assistant's thinking; ``loss`` (optional bool) forces an assistant turn in or out
of training; ``tool_calls`` (optional, assistant turns only) is a JSON list of
``{"name", "arguments"}`` calls the turn makes (OpenAI's ``{"type": "function", "function": {...}}``
is accepted too), which each family template renders in its own format; ``tools`` is a JSON list
of tool schemas. Every message carries all five keys (None when absent) so the Arrow schema is
the same for every row and every source, and mixed datasets concatenate.
A multimodal row adds ``images`` and ``videos`` (see :mod:`twinkle.multimodal.media`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.dataset.errors import DataError, preview

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_KEYS = ("role", "content", "reasoning_content", "loss", "tool_calls")


def message_features(media: bool = False) -> Any:
    """The ``datasets.Features`` of a preprocessed row (with ``media``: the images/videos columns too)."""
    import datasets

    from twinkle.multimodal.media import media_features

    extra = media_features() if media else {}

    message = {
        "role": datasets.Value("string"),
        "content": datasets.Value("string"),
        "reasoning_content": datasets.Value("string"),
        "loss": datasets.Value("bool"),
        "tool_calls": datasets.Value("string"),
    }
    return datasets.Features({"messages": [message], "tools": datasets.Value("string"), **extra})


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """Validate a conversation and return it with every message holding exactly MESSAGE_KEYS.

    Raises DataError naming the offending message: not a list, empty, a message that is not a
    dict, an unknown role, non-string content, tool calls outside an assistant turn or not in the
    ``{"name", "arguments"}`` form, a misplaced system turn, no assistant turn, or an assistant turn
    before any user turn. An assistant turn that only calls tools may have ``content`` None.
    """
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise DataError(f"'messages' must be a list of {{'role', 'content'}} dicts, got {preview(messages)}.")
    if len(messages) == 0:
        raise DataError("the conversation is empty; it needs at least a user turn and an assistant turn.")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise DataError(f"message {i} is a {type(message).__name__}, not a dict: {preview(message)}.")
        role = message.get("role")
        if role not in ROLES:
            raise DataError(f"message {i} has role {role!r}; roles are {', '.join(ROLES)}.")
        tool_calls = tool_calls_json(message.get("tool_calls"), f"message {i} ({role})")
        if tool_calls is not None and role != "assistant":
            raise DataError(f"message {i} is a {role} turn with tool_calls; only assistant turns call tools.")
        content = message.get("content")
        if content is None and tool_calls is not None:
            content = ""
        if not isinstance(content, str):
            raise DataError(f"message {i} ({role}) has content {preview(content)}; content must be a string.")
        reasoning = message.get("reasoning_content")
        if reasoning is not None and not isinstance(reasoning, str):
            raise DataError(f"message {i} ({role}) has a non-string reasoning_content: {preview(reasoning)}.")
        loss = message.get("loss")
        if loss is not None and not isinstance(loss, bool):
            raise DataError(f"message {i} ({role}) has loss={loss!r}; use true, false or leave it out.")
        if role == "system" and i != 0:
            raise DataError(f"message {i} is a system turn; a system turn may only come first.")
        out.append({"role": role, "content": content, "reasoning_content": reasoning, "loss": loss,
                    "tool_calls": tool_calls})
    roles = [m["role"] for m in out]
    if "assistant" not in roles:
        raise DataError(f"the conversation has no assistant turn (roles: {roles}); there is nothing to train on.")
    first = next(r for r in roles if r != "system")
    if first != "user":
        raise DataError(
            f"the conversation starts with a {first} turn (roles: {roles}); it must start with a user turn."
        )
    return out


def tool_calls_json(calls: Any, where: str = "tool_calls") -> str | None:
    """An assistant turn's tool calls as the JSON string a row stores: ``[{"name", "arguments"}, ...]``.

    Accepts a list (or one call) of ``{"name", "arguments"}`` or OpenAI's ``{"type": "function",
    "function": {"name", "arguments"}}``, as objects or as a JSON string. ``arguments`` given as a JSON
    object string is parsed; other strings are kept as they are (a template renders them verbatim).
    """
    if calls is None or calls == "" or calls == []:
        return None
    if isinstance(calls, str):
        calls = _parsed(calls, f"{where}: tool_calls")
    if isinstance(calls, Mapping):
        calls = [calls]
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        raise DataError(f"{where}: tool_calls must be a list of {{'name', 'arguments'}} calls, got {preview(calls)}.")
    out = []
    for call in calls:
        fn = call.get("function", call) if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise DataError(f"{where}: each tool call needs a 'name' (and 'arguments'), got {preview(call)}.")
        arguments = fn.get("arguments")
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments)
            except json.JSONDecodeError:
                parsed = arguments
            arguments = parsed if isinstance(parsed, Mapping) else arguments
        out.append({"name": fn["name"], "arguments": {} if arguments is None else arguments})
    return json.dumps(out, ensure_ascii=False)


def _parsed(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{what} is not valid JSON ({exc}): {preview(text)}.") from None


def tools_json(tools: Any) -> str | None:
    """Tool schemas as the JSON string the ``tools`` column stores (None when absent)."""
    if tools is None or tools == "" or tools == []:
        return None
    parsed = _parsed(tools, "'tools'") if isinstance(tools, str) else tools
    if not isinstance(parsed, list) or not all(isinstance(t, Mapping) for t in parsed):
        raise DataError(f"'tools' must be a list of JSON tool schemas, got {preview(tools)}.")
    return json.dumps(parsed, ensure_ascii=False)


def standard_row(messages: Any, tools: Any = None, images: Any = None, videos: Any = None) -> dict[str, Any]:
    """A checked row in the standard format.

    With media (``images``/``videos`` lists, or image/video parts inside message contents) the row
    also holds ``images`` and ``videos`` and each item has its ``<image>``/``<video>`` tag in the text
    (see :mod:`twinkle.multimodal.media`).
    """
    from twinkle.multimodal import media

    messages, images, videos = media.split_content(messages, images or (), videos or ())
    row = {"messages": check_messages(messages), "tools": tools_json(tools)}
    if images or videos:
        row["messages"] = media.place_tags(row["messages"], len(images), len(videos))
        row.update(media.stored_media(images, videos))
    return row
