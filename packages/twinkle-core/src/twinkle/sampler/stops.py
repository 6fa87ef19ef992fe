"""Where a sampled completion ends: the first stop token or stop string, else the token budget."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from twinkle.sampler.types import SampledSequence

Decode = Callable[[list[int]], str]


def _string_end(tokens: list[int], stop_strings: Sequence[str], decode: Decode) -> int | None:
    """The fewest tokens whose text contains a stop string (binary search on decoded prefixes), or None."""
    def stopped(count: int) -> bool:
        text = decode(tokens[:count])
        return any(s in text for s in stop_strings)

    if not tokens or not stopped(len(tokens)):
        return None
    low, high = 1, len(tokens)
    while low < high:
        mid = (low + high) // 2
        if stopped(mid):
            high = mid
        else:
            low = mid + 1
    return low


def finish(tokens: Sequence[int], logprobs: Sequence[float], stop_token_ids: Sequence[int],
           stop_strings: Sequence[str] = (), decode: Decode | None = None) -> SampledSequence:
    """Cut a generated row after its first stop (the stop token or the token completing a stop string is kept).

    ``tokens``/``logprobs`` are plain lists (``tensor.tolist()``); the text is decoded when first read.
    """
    tokens, logprobs = list(tokens), list(logprobs)
    end, reason = len(tokens), "length"
    if stop_token_ids:
        stops = set(stop_token_ids)
        k = next((k for k, token in enumerate(tokens) if token in stops), None)
        if k is not None:
            end, reason = k + 1, "stop"
    if stop_strings:
        if decode is None:
            raise ValueError("Stop strings need a tokenizer to decode the samples; give the sampler one "
                             "(tokenizer=... or a template on the model), or stop on token ids.")
        cut = _string_end(tokens[:end], stop_strings, decode)
        if cut is not None:
            end, reason = cut, "stop"
    if end < len(tokens):
        tokens, logprobs = tokens[:end], logprobs[:end]
    return SampledSequence(tokens, logprobs, reason, decode=decode)
