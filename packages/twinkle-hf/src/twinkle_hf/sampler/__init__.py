"""Samplers on transformers models: TorchSampler (the training model's own weights) and VLLMSampler (vLLM).

``VLLMSampler`` needs the ``vllm`` extra (``pip install twinkle-hf[vllm]``, CUDA only); importing this
package never imports vLLM.
"""

from twinkle_hf.sampler.torch_sampler import TorchSampler
from twinkle_hf.sampler.vllm_sampler import VLLMSampler

__all__ = ["TorchSampler", "VLLMSampler"]
