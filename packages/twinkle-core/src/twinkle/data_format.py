"""The shapes of the data a script passes around, under upstream Twinkle's names.

``Message``, ``ToolCall``, ``Tool`` and ``Trajectory`` are ``TypedDict`` s: annotations, plain dicts at
run time, so ``Message(role='user', content='hi')`` is ``{'role': 'user', 'content': 'hi'}``, which every
preprocessor, template and dataset here reads (the standard conversation of
:mod:`twinkle.preprocessor.messages`). ``InputFeature`` and ``ModelOutput`` are :mod:`twinkle.types`'
(a loss's two arguments); ``LossOutput`` is what calling a :class:`twinkle.loss.Loss` returns.

A trajectory's ``user_data`` is a list of ``(key, value)`` pairs with each value a JSON string, so an
Arrow column holds values of any type (:func:`pack_value` / :func:`user_data_get`).

Importing this module imports no torch.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal, TypedDict

from twinkle.types import InputFeature, ModelOutput

if TYPE_CHECKING:
    from twinkle.loss.base import LossOutput

__all__ = ["FunctionCall", "InputFeature", "LossOutput", "Message", "ModelOutput", "Tool", "ToolCall", "Trajectory",
           "pack_value", "user_data_get"]


class FunctionCall(TypedDict, total=False):
    """A tool call's ``function``: the tool's name and its arguments (a dict, or a JSON string)."""

    name: str
    arguments: str | dict[str, Any]


class ToolCall(TypedDict, total=False):
    """One call an assistant turn makes, in OpenAI's form ``{'type': 'function', 'function': {...}}``."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class FunctionSpec(TypedDict, total=False):
    """A tool definition's ``function``: name, description and the JSON schema of its parameters."""

    name: str
    description: str
    parameters: str | dict[str, Any]


class Tool(TypedDict, total=False):
    """A tool the model is told about, in OpenAI's form ``{'type': 'function', 'function': {...}}``."""

    type: Literal["function"]
    function: FunctionSpec


class Message(TypedDict, total=False):
    """One turn of a conversation (see :mod:`twinkle.preprocessor.messages` for what is checked)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    reasoning_content: str
    tool_calls: list[ToolCall]
    tool_call_id: str
    #: twinkle's: force an assistant turn in (True) or out (False) of training
    loss: bool


class Trajectory(TypedDict, total=False):
    """A conversation with what travels with it: tools, media, and ``user_data`` for rewards."""

    messages: list[Message]
    tools: list[Tool]
    #: ``(key, pack_value(value))`` pairs, e.g. the reference answer a reward reads
    user_data: list[tuple[str, str]]
    images: list[Any] | None
    videos: list[Any] | None
    audios: list[Any] | None
    prompt: str | None


def pack_value(value: Any) -> str:
    """``value`` as the JSON string a ``user_data`` pair holds (non-JSON values by their ``str``)."""
    return json.dumps(value, ensure_ascii=False, default=str)


def user_data_get(items: Any, key: str, default: Any = None) -> Any:
    """The first ``user_data`` value under ``key``, decoded from JSON (a string that is not JSON as is).

    Args:
        items: a trajectory's ``user_data`` (a list of ``(key, value)`` pairs); anything else gives ``default``.
        key: the key looked up.
        default: returned when no pair has ``key``.

    Returns:
        The decoded value, or ``default``.
    """
    if not isinstance(items, list):
        return default
    for entry in items:
        if isinstance(entry, (list, tuple)) and len(entry) == 2 and entry[0] == key:
            value = entry[1]
            if not isinstance(value, str):
                return value
            try:
                return json.loads(value)
            except ValueError:
                return value
    return default


def __getattr__(name: str) -> Any:
    # LossOutput lives with the losses, which import torch: loaded only when asked for
    if name == "LossOutput":
        from twinkle.loss.base import LossOutput

        return LossOutput
    raise AttributeError(f"module 'twinkle.data_format' has no attribute {name!r}")
