"""Template: standard conversations -> input_ids / labels / attention_mask / position_ids / length.

Rendering is the tokenizer's own chat template (so training sees exactly what inference sees);
twinkle only decides which tokens are trained: the content and end-of-turn token of assistant
turns (every assistant turn by default; ``train_turns='last'`` keeps only the last, and a
message's ``loss`` field overrides either way). Everything else is labelled -100.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from twinkle.constants import TRUNCATION_STRATEGIES
from twinkle.dataset.errors import DataError
from twinkle.template.labels import (
    IGNORE_INDEX,
    labels_from_encoding,
    labels_from_spans,
    truncate,
)
from twinkle.template.spans import (
    Conversation,
    Span,
    has_generation_markers,
    spans_from_markers,
    spans_from_prefixes,
)

TRAIN_TURNS = ("all", "last")
EncodeResult = tuple[dict[str, list[int] | int] | None, str | None]


class Template:
    """Generic chat-template encoder; named subclasses (Qwen3Template, ...) only adjust the class defaults.

    ``model_id``: where the tokenizer lives (any id :func:`twinkle.hub.resolve_path` accepts);
    ``None`` is twinkle's embedded tokenizer. ``max_length``/``truncation_strategy``: see
    :func:`twinkle.template.labels.truncate`. ``chat_template`` overrides the tokenizer's;
    ``default_system`` is added to conversations without a system turn. ``trust_remote_code``: let
    ``AutoTokenizer`` run the tokenizer code a model repository ships (GLM-4, InternLM2 need it).
    Other keyword arguments reach the chat template as variables (e.g. ``enable_thinking=True``).
    """

    #: used instead of the tokenizer's template (ChatMLTemplate)
    forced_chat_template: ClassVar[str | None] = None
    #: used when the tokenizer has no chat template
    fallback_chat_template: ClassVar[str | None] = None
    #: chat-template variables of this model family
    default_template_kwargs: ClassVar[dict[str, Any]] = {}
    #: the text closing an assistant turn, if the family has a fixed one (else the tokenizer's eos token)
    turn_end_token: ClassVar[str | None] = None
    #: the tool-call syntax the family's models write (a ToolCallRegistry name); None tries every parser
    tool_call_parser: ClassVar[str | None] = None

    def __init__(
        self,
        model_id: str | None = None,
        max_length: int | None = None,
        truncation_strategy: str = "raise",
        *,
        tokenizer: Any = None,
        chat_template: str | None = None,
        default_system: str | None = None,
        train_turns: str = "all",
        trust_remote_code: bool = False,
        **template_kwargs: Any,
    ) -> None:
        if truncation_strategy not in TRUNCATION_STRATEGIES:
            raise ValueError(
                f"truncation_strategy={truncation_strategy!r}; choose one of {', '.join(TRUNCATION_STRATEGIES)}."
            )
        if max_length is not None and (isinstance(max_length, bool) or not isinstance(max_length, int)
                                       or max_length < 1):
            raise ValueError(f"max_length must be a positive integer or None, got {max_length!r}.")
        if train_turns not in TRAIN_TURNS:
            raise ValueError(f"train_turns={train_turns!r}; choose 'all' (every assistant turn) or 'last'.")
        self.model_id = model_id
        self.max_length = max_length
        self.truncation_strategy = truncation_strategy
        self.default_system = default_system
        self.train_turns = train_turns
        self.trust_remote_code = bool(trust_remote_code)
        self.explicit_template_kwargs = dict(template_kwargs)
        self.template_kwargs = {**self.default_template_kwargs, **template_kwargs}
        self._chat_template = chat_template
        self._tokenizer = tokenizer

    # ------------------------------------------------------------ tokenizer
    @property
    def tokenizer(self) -> Any:
        """The HF tokenizer, loaded on first use (offline for local paths and embedded assets)."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self.model_id, trust_remote_code=self.trust_remote_code)
        return self._tokenizer

    @property
    def pad_token_id(self) -> int:
        tok = self.tokenizer
        for value in (tok.pad_token_id, tok.eos_token_id):
            if value is not None:
                return int(value)
        return 0

    @property
    def chat_template(self) -> str:
        """The Jinja chat template used to render conversations."""
        if self._chat_template:
            return self._chat_template
        if self.forced_chat_template:
            return self.forced_chat_template
        own = getattr(self.tokenizer, "chat_template", None)
        if isinstance(own, Mapping):
            own = own.get("default")
        if own:
            return own
        if self.fallback_chat_template:
            return self.fallback_chat_template
        raise DataError(
            f"The tokenizer of {self.model_id or 'twinkle://tiny-qwen'!r} has no chat template. Use a template that "
            "brings one (ChatMLTemplate, Llama3Template, ...) or pass chat_template='...'."
        )

    @property
    def turn_end(self) -> str | None:
        """The text that closes an assistant turn (trained with it); the tokenizer's eos token by default."""
        return self.turn_end_token or getattr(self.tokenizer, "eos_token", None)

    # -------------------------------------------------------------- encode
    def encode(self, row: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
        """Encode one row (``{'messages': [...]}``) or a bare message list; None if truncation dropped it."""
        encoded, _ = self.batch_encode([row])[0]
        return encoded

    def batch_encode(self, rows: Sequence[Any], indices: Sequence[int] | None = None) -> list[EncodeResult]:
        """Encode many rows at once; each result is ``(encoded, None)`` or ``(None, why it was dropped)``.

        Bad rows raise :class:`DataError` naming ``indices[k]`` (the dataset row).
        """
        indices = list(range(len(rows))) if indices is None else list(indices)
        convs = [self._conversation(row, idx) for row, idx in zip(rows, indices)]
        rendered = self._render(convs, indices)
        tokenized = self._tokenize([text for text, _ in rendered])
        results: list[EncodeResult] = []
        for conv, (_, spans), (ids, labeler), index in zip(convs, rendered, tokenized, indices):
            trained = [span for span, keep in zip(spans, self._trained_turns(conv)) if keep]
            results.append(self._finish(ids, labeler(trained), index))
        return results

    # ------------------------------------------------------- RL prompts and preference pairs
    def encode_prompt(self, row: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """A prompt for sampling: the conversation rendered with the generation prompt (the assistant turn opened).

        ``row`` is ``{'messages': [...]}`` (optionally ``tools``) or a bare message list ending with a user
        (or tool) turn. Returns ``{'input_ids', 'length'}``.
        """
        messages = list(row.get("messages") or []) if isinstance(row, Mapping) else list(row)
        tools = row.get("tools") if isinstance(row, Mapping) else None
        if not messages or not isinstance(messages[-1], Mapping) or messages[-1].get("role") == "assistant":
            raise DataError("encode_prompt needs messages ending with a user (or tool) turn, the one to answer; got "
                            f"{[m.get('role') if isinstance(m, Mapping) else type(m).__name__ for m in messages]}.")
        # validate as a conversation with an (empty) answer, then render without it
        conv = self._conversation({"messages": [*messages, {"role": "assistant", "content": ""}], "tools": tools}, 0)
        text = self._renderer(conv.tools, self.conversation_kwargs(conv))([conv.messages[:-1]], True)[0]
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return {"input_ids": ids, "length": len(ids)}

    def encode_preference(self, row: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """(chosen, rejected) encoded rows sharing the prompt; only each final answer is trained.

        ``row``: ``messages`` (or ``prompt``: a message list or a user string) and ``chosen`` / ``rejected``
        (a string, an assistant message, or a one-message list). Feed the pair as two consecutive rows to a
        preference loss (``dpo``, ``ipo``, ``simpo``, ``orpo``). ``Dataset.encode`` calls this for rows
        with ``chosen`` and ``rejected`` columns.
        """
        pair, _ = self.preference_pair(row)
        return pair

    def preference_pair(self, row: Mapping[str, Any], index: int = 0, drop: bool = False
                        ) -> tuple[tuple[dict[str, Any], dict[str, Any]] | None, str | None]:
        """``((chosen, rejected), None)``, or with ``drop`` ``(None, why)`` for a pair truncation dropped.

        Args:
            row: as for :meth:`encode_preference`.
            index: the dataset row, named in errors.
            drop: return a dropped pair instead of raising (``truncation_strategy='delete'``).
        """
        prompt = row.get("messages", row.get("prompt"))
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        if not isinstance(prompt, Sequence) or not prompt:
            raise DataError(f"a preference row needs 'messages' (or 'prompt'), got fields {sorted(row)}.")
        prompt = [{**m, "loss": False} if isinstance(m, Mapping) and m.get("role") == "assistant" else m
                  for m in prompt]
        answers = []
        for key in ("chosen", "rejected"):
            answer = row.get(key)
            if isinstance(answer, Sequence) and not isinstance(answer, str) and len(answer) == 1:
                answer = answer[0]
            if isinstance(answer, Mapping):
                answer = answer.get("content")
            if not isinstance(answer, str):
                raise DataError(f"a preference row needs '{key}' as a string or an assistant message, got "
                                f"{type(row.get(key)).__name__}.")
            answers.append({"messages": [*prompt, {"role": "assistant", "content": answer, "loss": True}],
                            "tools": row.get("tools")})
        (chosen, why_c), (rejected, why_r) = self.batch_encode(answers, [index, index])
        if chosen is None or rejected is None:
            if drop:
                return None, why_c or why_r
            raise DataError(f"the preference pair could not be encoded: {why_c or why_r}.")
        start = [next(i for i, label in enumerate(e["labels"]) if label != IGNORE_INDEX) for e in (chosen, rejected)]
        if start[0] != start[1] or chosen["input_ids"][:start[0]] != rejected["input_ids"][:start[1]]:
            raise DataError("the chosen and rejected answers render different prompts with this chat template; a "
                            "preference pair must share its prompt tokens.")
        return (chosen, rejected), None

    def _tokenize(self, texts: list[str]) -> list[tuple[list[int], Any]]:
        """(ids, spans -> labels) per text. Uses the Rust tokenizer directly when the HF wrapper adds nothing
        (no truncation/padding configured on it): one batch call, labels in O(spans)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None and backend.truncation is None and backend.padding is None:
            encodings = backend.encode_batch(texts, add_special_tokens=False)
            return [(e.ids, lambda spans, e=e: labels_from_encoding(e, spans)) for e in encodings]
        if not getattr(self.tokenizer, "is_fast", True):
            return [_slow_tokenize(self.tokenizer, text) for text in texts]
        enc = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        out = []
        for ids, offsets in zip(enc["input_ids"], enc["offset_mapping"]):
            ids = list(ids)
            out.append((ids, lambda spans, ids=ids, offsets=offsets: labels_from_spans(ids, offsets, spans)))
        return out

    def _conversation(self, row: Any, index: int) -> Conversation:
        from twinkle.preprocessor.messages import check_messages

        messages = row.get("messages") if isinstance(row, Mapping) else row
        tools = row.get("tools") if isinstance(row, Mapping) else None
        if isinstance(row, Mapping) and messages is None:
            raise DataError(
                f"row {index} has no 'messages' (fields: {', '.join(map(repr, row)) or 'none'}); map the dataset "
                "with a preprocessor first, e.g. dataset.map(MessagesProcessor())."
            )
        try:
            checked = check_messages(messages)
            parsed_tools = json.loads(tools) if isinstance(tools, str) else tools
        except (DataError, json.JSONDecodeError) as exc:
            raise DataError(f"row {index}: {exc}") from None
        if self.default_system and checked[0]["role"] != "system":
            checked.insert(0, {"role": "system", "content": self.default_system})
        clean = [_for_chat_template(m) for m in checked]
        return Conversation(clean, parsed_tools or None, [m["loss"] for m in checked if m["role"] == "assistant"])

    def _trained_turns(self, conv: Conversation) -> list[bool]:
        flags = conv.loss_flags
        last = len(flags) - 1
        return [f if f is not None else (self.train_turns == "all" or n == last) for n, f in enumerate(flags)]

    def conversation_kwargs(self, conv: Conversation) -> dict[str, Any]:
        """Chat-template variables for one conversation (a family template may decide per conversation)."""
        return self.template_kwargs

    def _render(self, convs: list[Conversation], indices: list[int]) -> list[tuple[str, list[Span]]]:
        template = self.chat_template
        fast: list[tuple[str, list[Span]] | None] = [None] * len(convs)
        if has_generation_markers(template):
            groups: dict[str, list[int]] = {}
            for k, conv in enumerate(convs):
                groups.setdefault(json.dumps(self.conversation_kwargs(conv), sort_keys=True, default=str), []).append(k)
            for members in groups.values():
                batch = [convs[k] for k in members]
                for k, result in zip(members, self._render_marked(batch, [indices[k] for k in members])):
                    fast[k] = result
        out = []
        for k, conv in enumerate(convs):
            if fast[k] is not None:
                out.append(fast[k])
                continue
            render = self._renderer(conv.tools, self.conversation_kwargs(conv))
            try:
                out.append(spans_from_prefixes(conv, render, self.turn_end))
            except Exception as exc:
                raise DataError(f"row {indices[k]}: {_describe(exc)}") from None
        return out

    def _render_marked(self, convs: list[Conversation], indices: list[int]) -> list[tuple[str, list[Span]] | None]:
        """Render with {% generation %} tracking; if the batch fails, re-render row by row to name the row."""
        template = self.chat_template
        kwargs = {**_special_tokens(self.tokenizer), **self.conversation_kwargs(convs[0])}
        try:
            return spans_from_markers(convs, template, kwargs)
        except Exception:
            for conv, idx in zip(convs, indices):
                try:
                    spans_from_markers([conv], template, kwargs)
                except Exception as exc:
                    raise DataError(f"row {idx}: the chat template failed: {_describe(exc)}") from None
            raise

    def _renderer(self, tools: list[dict[str, Any]] | None, kwargs: dict[str, Any]) -> Any:
        tok, template = self.tokenizer, self.chat_template

        def render(conversations: list[list[dict[str, Any]]], add_generation_prompt: bool) -> list[str]:
            if not conversations:
                return []
            return tok.apply_chat_template(conversations, tools=tools, chat_template=template, tokenize=False,
                                           add_generation_prompt=add_generation_prompt, **kwargs)

        return render

    def _finish(self, ids: list[int], labels: list[int], index: int) -> EncodeResult:
        kept = truncate(ids, labels, self.max_length, self.truncation_strategy, f"row {index}")
        if kept is None:
            return None, f"longer than max_length={self.max_length}"
        truncated = len(kept[0]) < len(ids)
        ids, labels = kept
        if all(label == IGNORE_INDEX for label in labels):
            return None, "no trained token left after truncation" if truncated else "no trained token"
        n = len(ids)
        return {"input_ids": ids, "labels": labels, "attention_mask": [1] * n, "position_ids": list(range(n)),
                "length": n}, None

    def parse_tool_call(self, text: str) -> list[dict[str, Any]]:
        """The tool calls a completion holds, in the standard conversation's ``tool_calls`` form.

        Read with the family's :attr:`tool_call_parser`, else the first parser that finds a call
        (:class:`twinkle.template.tools.ToolCallRegistry`). ``parse`` is upstream Twinkle's name.
        """
        parser = self._tool_parser(text)
        return parser.parse(text) if parser is not None else []

    def clean_tool_call(self, text: str) -> str:
        """The completion without its tool calls (``clean`` is upstream Twinkle's name)."""
        parser = self._tool_parser(text)
        return parser.clean(text) if parser is not None else (text or "").strip()

    parse = parse_tool_call
    clean = clean_tool_call

    def _tool_parser(self, text: str) -> Any:
        from twinkle.template.tools import ToolCallRegistry

        if self.tool_call_parser is not None:
            return ToolCallRegistry.get(self.tool_call_parser)
        return ToolCallRegistry.detect_first(text)

    def save_pretrained(self, directory: Any) -> None:
        """Write what encodes like this template into a model directory (the tokenizer; VL: the processor)."""
        self.tokenizer.save_pretrained(str(directory))

    # -------------------------------------------------------------- caching
    def fingerprint(self) -> str:
        """A hash of everything that decides the encoding (for the datasets cache)."""
        tok = self.tokenizer
        backend = getattr(tok, "backend_tokenizer", None)
        h = hashlib.sha256()
        from twinkle import __version__

        vocabulary = backend.to_str() if backend else repr(tok)
        for part in (type(self).__qualname__, __version__, self.chat_template, vocabulary,
                     json.dumps([self.max_length, self.truncation_strategy, self.default_system, self.train_turns,
                                 self.template_kwargs], sort_keys=True, default=str)):
            h.update(part.encode("utf-8"))
            h.update(b"\0")
        return h.hexdigest()[:32]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(model_id={self.model_id!r}, max_length={self.max_length}, "
                f"truncation_strategy={self.truncation_strategy!r})")


def load_tokenizer(model_id: str | None, trust_remote_code: bool = False) -> Any:
    """``AutoTokenizer`` for ``model_id`` (None: the embedded one), resolved by :func:`twinkle.hub.resolve_path`.

    ``trust_remote_code`` lets a repository's own tokenizer code run (its ``auto_map``). Slow (Python)
    tokenizers are accepted: they give no character offsets, so labels are placed by tokenizing the
    text up to each trained span's edges (:func:`_slow_tokenize`).
    """
    from twinkle.assets import DEFAULT_MODEL_ID
    from twinkle.hub import resolve_path

    source = model_id or DEFAULT_MODEL_ID
    path = resolve_path(source, "model", allow_patterns=["*.json", "*.jinja", "*.model", "*.txt", "*.tiktoken"])
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        hint = ""
        if not trust_remote_code and ("trust_remote_code" in str(exc) or _ships_tokenizer_code(path)):
            hint = (" This repository ships its own tokenizer code; pass trust_remote_code=True to the template "
                    "(e.g. dataset.set_template('GLM4Template', model_id=..., trust_remote_code=True)) to run it.")
        raise DataError(f"Could not load a tokenizer from {source!r} ({path}): {type(exc).__name__}: {exc}.{hint}"
                        ) from exc
    return tokenizer


def _ships_tokenizer_code(path: Any) -> bool:
    """Whether a model directory names its own tokenizer code (``auto_map`` in tokenizer_config.json)."""
    from pathlib import Path

    config = Path(path) / "tokenizer_config.json"
    try:
        return "AutoTokenizer" in (json.loads(config.read_text(encoding="utf-8")).get("auto_map") or {})
    except (OSError, ValueError, AttributeError):
        return False


def _slow_tokenize(tokenizer: Any, text: str) -> tuple[list[int], Any]:
    """(ids, spans -> labels) with a tokenizer that reports no offsets.

    A span edge at character c maps to ``len(encode(text[:c]))`` tokens, which is exact when the
    tokens of ``text[:c]`` are a prefix of those of ``text`` -- true at the special tokens that open
    and close turns, which slow tokenizers split out before tokenizing. Where it is not (the
    tokenizer merges characters across the edge), labelling stops with a DataError naming the edge.
    """
    ids = list(tokenizer.encode(text, add_special_tokens=False))

    def edge(c: int) -> int:
        head = list(tokenizer.encode(text[:c], add_special_tokens=False)) if c else []
        if ids[:len(head)] != head:
            raise DataError(
                f"the {type(tokenizer).__name__} tokenizer (slow: no character offsets) merges characters across the "
                f"trained span edge at character {c} ({text[max(c - 20, 0):c]!r} | {text[c:c + 20]!r}), so the "
                "trained tokens cannot be told apart. Use a fast tokenizer, or a chat template that puts special "
                "tokens at the turn edges.")
        return len(head)

    def labels(spans: list[Span]) -> list[int]:
        out = [IGNORE_INDEX] * len(ids)
        for start, end in spans:
            first, last = edge(start), edge(end)
            out[first:last] = ids[first:last]
        return out

    return ids, labels


def _for_chat_template(message: dict[str, Any]) -> dict[str, Any]:
    """A checked message as chat templates read it: None-valued keys and ``loss`` removed, ``tool_calls``
    as the ``[{"type": "function", "function": {"name", "arguments"}}]`` list transformers' templates expect."""
    out = {k: v for k, v in message.items() if v is not None and k not in ("loss", "tool_calls")}
    if message.get("tool_calls"):
        out["tool_calls"] = [{"type": "function", "function": call} for call in json.loads(message["tool_calls"])]
    return out


def _special_tokens(tokenizer: Any) -> dict[str, Any]:
    """What apply_chat_template passes to a template besides messages: bos_token, eos_token, ..."""
    return dict(getattr(tokenizer, "special_tokens_map", {}) or {})


def _describe(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, DataError) else f"{type(exc).__name__}: {exc}"
