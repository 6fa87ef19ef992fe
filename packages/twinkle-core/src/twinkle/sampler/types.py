"""What a sampler takes and returns, with Tinker's field names and meanings."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from twinkle.utils.checks import check_int

StopReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample (the fields of Tinker's ``SamplingParams`` plus ``n``, vLLM's samples per prompt).

    ``temperature=0`` is greedy decoding. ``top_k=-1`` (or 0) and ``top_p=1`` switch those filters off.
    ``stop``: ``None`` stops at the tokenizer's end-of-sequence token(s); a string or a list of strings
    and/or token ids stops at any of them (the end-of-sequence token is then not a stop unless listed);
    ``[]`` never stops before ``max_tokens``. ``seed``: the same seed and request give the same samples.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    n: int = 1
    stop: str | Sequence[str | int] | None = None
    seed: int | None = None

    def __post_init__(self) -> None:
        check_int(self.max_tokens, "SamplingParams.max_tokens")
        check_int(self.n, "SamplingParams.n")
        if not (isinstance(self.temperature, (int, float)) and self.temperature >= 0):
            raise ValueError(f"SamplingParams.temperature must be >= 0 (0 is greedy), got {self.temperature!r}.")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p!r}.")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be an integer >= 1, or -1/0 for no limit; got {self.top_k!r}.")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0):
            raise ValueError(f"SamplingParams.seed must be a non-negative integer or None, got {self.seed!r}.")
        stops = self.stop_list
        bad = [s for s in stops if isinstance(s, bool) or not isinstance(s, (str, int)) or s == ""
               or (isinstance(s, int) and s < 0)]
        if bad:
            raise ValueError(f"SamplingParams.stop holds {bad!r}; give non-empty strings and/or token ids >= 0.")

    @property
    def stop_list(self) -> list[str | int]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, (str, int)) else list(self.stop)

    @property
    def stop_strings(self) -> list[str]:
        return [s for s in self.stop_list if isinstance(s, str)]

    def stop_token_ids(self, eos_token_ids: Sequence[int]) -> list[int]:
        """Token ids that end a sample: the listed ones, or the end-of-sequence ids when ``stop`` is None."""
        if self.stop is None:
            return list(eos_token_ids)
        return [s for s in self.stop_list if isinstance(s, int)]

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def top_k_or_none(self) -> int | None:
        return self.top_k if self.top_k > 0 else None


class SampledSequence:
    """One completion: its tokens (a stop token included), their log-probabilities and why it ended.

    ``logprobs[i]`` is the log-probability of ``tokens[i]`` under the model's distribution (temperature
    1, no top-k/top-p filter), the quantity a policy-gradient loss compares against. ``text`` is the
    decoded completion; a sampler may pass ``decode=`` instead, and the text is then decoded on first
    read (sampling itself never waits for a tokenizer).
    """

    __slots__ = ("tokens", "logprobs", "stop_reason", "_text", "_decode")

    def __init__(self, tokens: list[int], logprobs: list[float], stop_reason: StopReason, text: str | None = None,
                 *, decode: Callable[[list[int]], str] | None = None) -> None:
        self.tokens = tokens
        self.logprobs = logprobs
        self.stop_reason = stop_reason
        self._text = text
        self._decode = decode if text is None else None

    @property
    def text(self) -> str | None:
        if self._decode is not None:
            self._text, self._decode = self._decode(self.tokens), None
        return self._text

    @text.setter
    def text(self, value: str | None) -> None:
        self._text, self._decode = value, None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SampledSequence):
            return NotImplemented
        return (self.tokens, self.logprobs, self.stop_reason, self.text) == \
            (other.tokens, other.logprobs, other.stop_reason, other.text)

    def __repr__(self) -> str:
        return (f"SampledSequence(tokens={self.tokens!r}, logprobs={self.logprobs!r}, "
                f"stop_reason={self.stop_reason!r}, text={self.text!r})")

    def __reduce__(self) -> tuple[Any, ...]:  # pickles (Ray, the server) carry the text, not the tokenizer
        return SampledSequence, (self.tokens, self.logprobs, self.stop_reason, self.text)


@dataclass
class SampleResult:
    """The ``n`` completions of one prompt, with the adapter that produced them."""

    prompt: list[int]
    sequences: list[SampledSequence] = field(default_factory=list)
    adapter_name: str | None = None
