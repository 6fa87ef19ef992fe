"""Samplers: generate completions with per-token log-probabilities, per adapter or tenant.

The contract (:class:`Sampler`) is backend-neutral; ``TorchSampler`` (twinkle-hf) generates on the
training model's own weights, ``VLLMSampler`` (``twinkle-hf[vllm]``) on a vLLM engine kept in sync.
Both are resolved by name: ``resolve('sampler', 'TorchSampler')``.
"""

from twinkle.sampler.base import Sampler, as_prompts, check_prompt_limits, per_prompt_adapters
from twinkle.sampler.types import SampledSequence, SampleResult, SamplingParams

__all__ = ["SampleResult", "SampledSequence", "Sampler", "SamplingParams", "as_prompts", "check_prompt_limits",
           "per_prompt_adapters"]
