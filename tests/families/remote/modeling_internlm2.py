"""InternLM2ForCausalLM, reproduced as repository code (transformers has no InternLM2 class).

Same module and tensor names as internlm/internlm2_5-7b-chat's ``modeling_internlm2.py``
(``tok_embeddings``, ``attention.wqkv`` with q/k/v interleaved per key-value group, ``attention.wo``,
``feed_forward.w1/w3/w2``, ``attention_norm``, ``ffn_norm``, ``output``), so its checkpoints' names and
layouts are the real ones. Only what training a tiny model needs: no KV cache, no generation helpers,
the default rotary embedding, eager attention through ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

try:
    from .configuration_internlm2 import InternLM2Config
except ImportError:  # imported as a plain module (tests)
    from configuration_internlm2 import InternLM2Config


class InternLM2RMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(dtype)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class InternLM2Attention(nn.Module):
    def __init__(self, config: InternLM2Config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads
        self.wqkv = nn.Linear(config.hidden_size, (self.num_heads + 2 * self.num_key_value_heads) * self.head_dim,
                              bias=config.bias)
        self.wo = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.bias)
        self.is_causal = True

    def forward(self, hidden_states, cos, sin, attention_mask):
        bsz, q_len, _ = hidden_states.shape
        qkv = self.wqkv(hidden_states).view(bsz, q_len, self.num_key_value_heads, self.num_key_value_groups + 2,
                                            self.head_dim)
        query = qkv[..., : self.num_key_value_groups, :].reshape(bsz, q_len, self.num_heads, self.head_dim)
        key, value = qkv[..., -2, :], qkv[..., -1, :]
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        query = query * cos + rotate_half(query) * sin
        key = key * cos + rotate_half(key) * sin
        key = key.repeat_interleave(self.num_key_value_groups, dim=1)
        value = value.repeat_interleave(self.num_key_value_groups, dim=1)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask)
        return self.wo(out.transpose(1, 2).reshape(bsz, q_len, -1))


class InternLM2MLP(nn.Module):
    def __init__(self, config: InternLM2Config):
        super().__init__()
        self.w1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w3 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.w2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class InternLM2DecoderLayer(nn.Module):
    def __init__(self, config: InternLM2Config):
        super().__init__()
        self.attention = InternLM2Attention(config)
        self.feed_forward = InternLM2MLP(config)
        self.attention_norm = InternLM2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.ffn_norm = InternLM2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states, cos, sin, attention_mask):
        hidden_states = hidden_states + self.attention(self.attention_norm(hidden_states), cos, sin, attention_mask)
        return hidden_states + self.feed_forward(self.ffn_norm(hidden_states))


class InternLM2PreTrainedModel(PreTrainedModel):
    config_class = InternLM2Config
    base_model_prefix = "model"
    supports_gradient_checkpointing = False
    _no_split_modules = ["InternLM2DecoderLayer"]

    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(mean=0.0, std=std)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=std)
        elif isinstance(module, InternLM2RMSNorm):
            module.weight.data.fill_(1.0)


class InternLM2Model(InternLM2PreTrainedModel):
    def __init__(self, config: InternLM2Config):
        super().__init__(config)
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, config.pad_token_id)
        self.layers = nn.ModuleList([InternLM2DecoderLayer(config) for _ in range(config.num_hidden_layers)])
        self.norm = InternLM2RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_init()

    def get_input_embeddings(self):
        return self.tok_embeddings

    def set_input_embeddings(self, value):
        self.tok_embeddings = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, **kwargs):
        hidden = self.tok_embeddings(input_ids) if inputs_embeds is None else inputs_embeds
        bsz, seq = hidden.shape[:2]
        if position_ids is None:
            position_ids = torch.arange(seq, device=hidden.device).unsqueeze(0).expand(bsz, -1)
        head_dim = self.config.hidden_size // self.config.num_attention_heads
        inv_freq = 1.0 / (self.config.rope_theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                                                  device=hidden.device) / head_dim))
        freqs = position_ids[..., None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(hidden.dtype), emb.sin().to(hidden.dtype)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=hidden.device).tril()[None, None]
        if attention_mask is not None:
            mask = mask & attention_mask.bool()[:, None, None, :]
            mask = mask | ~mask.any(-1, keepdim=True)  # rows of padding attend somewhere (no NaN)
        for layer in self.layers:
            hidden = layer(hidden, cos, sin, mask)
        return BaseModelOutputWithPast(last_hidden_state=self.norm(hidden))


class InternLM2ForCausalLM(InternLM2PreTrainedModel):
    _tied_weights_keys = {}

    def __init__(self, config: InternLM2Config):
        super().__init__(config)
        self.model = InternLM2Model(config)
        self.vocab_size = config.vocab_size
        self.output = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.tok_embeddings

    def set_input_embeddings(self, value):
        self.model.tok_embeddings = value

    def get_output_embeddings(self):
        return self.output

    def set_output_embeddings(self, new_embeddings):
        self.output = new_embeddings

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, labels=None,
                **kwargs):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            inputs_embeds=inputs_embeds).last_hidden_state
        logits = self.output(hidden).float()
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)
