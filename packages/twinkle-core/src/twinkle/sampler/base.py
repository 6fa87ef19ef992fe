"""The Sampler contract every backend implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any

from twinkle.sampler.types import SampleResult, SamplingParams

Prompts = Sequence[Sequence[int]] | Sequence[Mapping[str, Any]] | Sequence[int]
Adapters = str | None | Sequence[str | None]


class Sampler(ABC):
    """Generates completions with per-token log-probabilities and scores given sequences.

    ``adapter_name`` selects the LoRA adapter (or multi-LoRA tenant) to sample with: one name for
    every prompt, or a list with one name per prompt (several adapters in one batch where the backend
    can). ``None`` means the model's only group; for a model with adapters it must be named.
    """

    @abstractmethod
    def sample(self, prompts: Prompts, sampling_params: SamplingParams | None = None, *,
               adapter_name: Adapters = None) -> list[SampleResult]:
        """One :class:`SampleResult` per prompt, each with ``sampling_params.n`` sequences."""

    @abstractmethod
    def compute_logprobs(self, sequences: Prompts, *, adapter_name: Adapters = None,
                         reference: bool = False) -> list[list[float | None]]:
        """For each sequence, ``log p(token_i | tokens_<i)`` for every position (``None`` for the first).

        ``reference=True`` scores with the reference policy: the base model with adapters disabled.
        """

    @abstractmethod
    def sync_weights(self, model: Any = None, *, adapter_name: str | None = None) -> None:
        """Bring the sampler's weights up to date with ``model`` after an optimizer step.

        A sampler that generates on the training model's own weights (``TorchSampler``) has nothing to
        do; an engine with its own copy (vLLM) reloads the adapter or the weights.
        """


def as_prompts(prompts: Prompts, what: str = "prompts") -> list[list[int]]:
    """Token-id lists from token lists, rows with ``input_ids``, or a single token list."""
    if isinstance(prompts, Mapping):
        prompts = [prompts]
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise TypeError(f"{what} must be a non-empty list of token-id lists (or rows with 'input_ids'), got "
                        f"{type(prompts).__name__}; encode text with the template first (template.encode_prompt).")
    if all(isinstance(t, int) and not isinstance(t, bool) for t in prompts):
        prompts = [prompts]
    out = []
    for i, prompt in enumerate(prompts):
        ids = prompt.get("input_ids") if isinstance(prompt, Mapping) else prompt
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or not ids \
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in ids):
            raise TypeError(f"{what}[{i}] must be a non-empty list of token ids (ints >= 0), got {str(ids)[:80]}.")
        out.append(list(ids))
    return out


def check_prompt_limits(prompts: Sequence[Sequence[int]], *, vocab_size: int | None, max_positions: int | None,
                        max_tokens: int = 0, what: str = "prompts",
                        positions_name: str = "max_position_embeddings") -> None:
    """Refuse token ids beyond the model's vocabulary and prompts (plus ``max_tokens``) beyond its positions.

    Without the first check an id past the embedding fails deep in the forward (an IndexError, or a
    device-side assert on a GPU); without the second a model samples past the positions it was
    trained for without a word. ``None`` skips a check (the model does not say).
    """
    for i, prompt in enumerate(prompts):
        if vocab_size is not None and prompt and max(prompt) >= vocab_size:
            k, token = next((k, t) for k, t in enumerate(prompt) if t >= vocab_size)
            raise ValueError(f"{what}[{i}] holds token id {token} at position {k}, outside the model's vocabulary "
                             f"(ids 0..{vocab_size - 1}); encode prompts with this model's tokenizer.")
        if max_positions is not None and len(prompt) + max_tokens > max_positions:
            asked = f"{len(prompt)} tokens + max_tokens {max_tokens}" if max_tokens else f"{len(prompt)} tokens"
            raise ValueError(f"{what}[{i}] needs {len(prompt) + max_tokens} positions ({asked}) but the model has "
                             f"{max_positions} ({positions_name}); shorten the prompt or lower max_tokens.")


def per_prompt_adapters(adapter_name: Adapters, count: int) -> list[str | None]:
    """One adapter name per prompt from a single name or a list."""
    if adapter_name is None or isinstance(adapter_name, str):
        return [adapter_name] * count
    names = list(adapter_name)
    if len(names) != count:
        raise ValueError(f"adapter_name lists {len(names)} names for {count} prompts; give one per prompt or one "
                         "name for all.")
    return names
