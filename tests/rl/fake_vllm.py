"""A stand-in for what VLLMSampler's full-weight sync meets in vLLM V1, for CPU tests.

* :class:`VllmQwen2` is laid out as vLLM's ``Qwen2ForCausalLM``: q/k/v packed into ``qkv_proj`` and
  gate/up into ``gate_up_proj``, and its ``load_weights`` does what vLLM's does (strip ``model.``,
  rename ``q_proj`` -> ``qkv_proj`` and copy the shard into its slot, then ``params_dict[name]``: a
  KeyError on a name the model does not hold). With ``lora=True`` every linear layer is replaced by a
  wrapper keeping the original as ``base_layer``, as vLLM does when ``enable_lora=True``.
* :class:`MultiprocessEngine` is ``vllm.LLM`` under the default V1 multiprocess engine:
  ``apply_model`` pickles the callback to the engine process, which vLLM refuses unless
  ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` (the engine process reads the environment it started with).
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import torch
from torch import nn

INSECURE = "VLLM_ALLOW_INSECURE_SERIALIZATION"


class LoRAWrapped(nn.Module):
    """vLLM's BaseLayerWithLoRA: the original layer becomes ``base_layer`` (adapter weights are plain tensors)."""

    def __init__(self, base_layer: nn.Module) -> None:
        super().__init__()
        self.base_layer = base_layer
        self.lora_a_stacked = torch.zeros(1)


class VllmQwen2(nn.Module):
    packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def __init__(self, config: Any, lora: bool) -> None:
        super().__init__()
        hidden, inter = config.hidden_size, config.intermediate_size
        head = hidden // config.num_attention_heads
        self.q_size, self.kv_size = config.num_attention_heads * head, config.num_key_value_heads * head
        self.inter = inter
        wrap = LoRAWrapped if lora else (lambda m: m)
        self.model = nn.Module()
        self.model.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        self.model.layers = nn.ModuleList()
        for _ in range(config.num_hidden_layers):
            layer = nn.Module()
            layer.self_attn = nn.Module()
            layer.self_attn.qkv_proj = wrap(nn.Linear(hidden, self.q_size + 2 * self.kv_size, bias=True))
            layer.self_attn.o_proj = wrap(nn.Linear(self.q_size, hidden, bias=False))
            layer.mlp = nn.Module()
            layer.mlp.gate_up_proj = wrap(nn.Linear(hidden, 2 * inter, bias=False))
            layer.mlp.down_proj = wrap(nn.Linear(inter, hidden, bias=False))
            layer.input_layernorm = nn.LayerNorm(hidden, bias=False)
            layer.post_attention_layernorm = nn.LayerNorm(hidden, bias=False)
            self.model.layers.append(layer)
        self.model.norm = nn.LayerNorm(hidden, bias=False)
        self.lm_head = nn.Linear(hidden, config.vocab_size, bias=False)
        for p in self.parameters():
            nn.init.zeros_(p)

    def _slot(self, shard: Any) -> tuple[int, int]:
        q, kv, inter = self.q_size, self.kv_size, self.inter
        return {"q": (0, q), "k": (q, kv), "v": (q + kv, kv), 0: (0, inter), 1: (inter, inter)}[shard]

    @torch.no_grad()
    def load_weights(self, weights) -> set[str]:
        stacked = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
                   ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]
        inner = dict(self.model.named_parameters())
        loaded = set()
        for name, tensor in weights:
            if name.startswith("lm_head."):
                dict(self.lm_head.named_parameters())[name.removeprefix("lm_head.")].copy_(tensor)
                continue
            name = name.removeprefix("model.")  # AutoWeightsLoader hands "model.*" to Qwen2Model.load_weights
            for param_name, weight_name, shard in stacked:
                if weight_name not in name:
                    continue
                name = name.replace(weight_name, param_name)
                start, size = self._slot(shard)
                inner[name].narrow(0, start, size).copy_(tensor)  # KeyError where vLLM's would raise it
                break
            else:
                inner[name].copy_(tensor)
            loaded.add(name)
        return loaded


class MultiprocessEngine:
    """``vllm.LLM`` with the engine core in its own process: the callback crosses by pickle, if vLLM allows it."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.engine_env = os.environ.get(INSECURE)  # what the engine process inherits when it starts
        self.resets = 0

    def apply_model(self, fn) -> list[Any]:
        if os.environ.get(INSECURE) != "1" or self.engine_env != "1":
            raise TypeError(f"Object of type {type(fn)} is not serializableSet {INSECURE}=1 to allow fallback to "
                            "pickle-based serialization.")  # vLLM's message
        return [pickle.loads(pickle.dumps(fn))(self.model)]

    def reset_prefix_cache(self) -> None:
        self.resets += 1


class Api:
    """VLLMSampler's ``api``: builds a MultiprocessEngine around ``VllmQwen2``."""

    def __init__(self, config: Any, lora: bool = True) -> None:
        self.config, self.lora, self.built = config, lora, None

    def llm(self, **kwargs: Any) -> MultiprocessEngine:
        self.built = kwargs
        return MultiprocessEngine(VllmQwen2(self.config, lora=self.lora and kwargs.get("enable_lora", False)))
