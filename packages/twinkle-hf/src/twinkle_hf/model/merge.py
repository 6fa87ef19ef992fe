"""A LoRA adapter merged into its base model, as a plain transformers model on the host, on any plan.

Every rank calls :func:`merged_model`. The weights of the training model (base weights and adapters,
LoRA layers still injected) are gathered as full tensors into rank 0's host memory, one tensor at a
time (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``: the other ranks never hold more
than their shards). Rank 0 then builds the same architecture on the meta device, injects the same peft
adapters, assigns the gathered tensors to it and lets peft merge (``merge_and_unload``). The training
module is never copied or changed: an FSDP2 module cannot be deep-copied, and merging its ``Shard(0)``
parameters on one rank would issue collectives the others never join.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from peft import PeftModel, get_peft_model

from twinkle import collective
from twinkle.config import ConfigError


def merged_model(backend: Any, adapter: str) -> torch.nn.Module | None:
    """The base model with ``adapter`` merged in, on the host; every rank must call it.

    Args:
        backend: the model's :class:`~twinkle_hf.model.backend.HFBackend`.
        adapter: the peft adapter to merge (the other adapters are left out).

    Returns:
        A transformers model on the CPU on rank 0 (on every rank of a single process); None elsewhere.
    """
    peft_model = backend.module
    if not isinstance(peft_model, PeftModel):
        raise ConfigError(f"lora.merge_on_export: the model has no LoRA adapter to merge (adapter {adapter!r}); "
                          "export the full model instead (merge_on_export=false).")
    if adapter not in peft_model.peft_config:
        raise ConfigError(f"lora.merge_on_export: adapter {adapter!r} is not one of the model's adapters "
                          f"{sorted(peft_model.peft_config)}.")
    hf_model = backend.hf_model()
    state = host_state(hf_model, sharded=backend.dist_plan.sharded)
    if collective.rank() != 0:
        return None
    skeleton = _peft_skeleton(hf_model, peft_model.peft_config)
    base = skeleton.get_base_model()
    _assign(base, hf_model, state)
    _untie_output_embeddings(base)
    return skeleton.merge_and_unload(adapter_names=[adapter])


def host_state(hf_model: torch.nn.Module, sharded: bool) -> dict[str, torch.Tensor]:
    """Full host copies of every tensor of the state dict: rank 0's when ``sharded`` (every rank takes part).

    Copies, so training may go on while they are written (an asynchronous export).
    """
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(hf_model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if collective.rank() != 0:
        return {}
    return {k: v.detach().to("cpu", copy=True) for k, v in hf_model.state_dict().items()}


def _peft_skeleton(hf_model: torch.nn.Module, configs: dict[str, Any]) -> PeftModel:
    """The architecture of ``hf_model`` with the same peft adapters, on the meta device (no memory)."""
    from twinkle_hf.distributed.checkpoint import _unwrapped_class

    names = list(configs)
    with torch.device("meta"):
        base = _unwrapped_class(hf_model)._from_config(copy.deepcopy(hf_model.config))
        skeleton = get_peft_model(base, copy.deepcopy(configs[names[0]]), adapter_name=names[0])
        for name in names[1:]:
            skeleton.add_adapter(name, copy.deepcopy(configs[name]))
    return skeleton


def _assign(base: torch.nn.Module, source: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Give the meta skeleton the gathered tensors, and the source's non-persistent buffers (rotary tables)."""
    result = base.load_state_dict(state, strict=False, assign=True)
    out = base.get_output_embeddings()
    out = getattr(out, "base_layer", out)
    tied_out = getattr(out, "weight", None)
    if tied_out is not None and tied_out.is_meta:  # a tied lm_head the state dict listed once
        out.weight = torch.nn.Parameter(base.get_input_embeddings().weight.detach().clone(), requires_grad=False)
    buffers = dict(source.named_buffers())
    for name, buffer in list(base.named_buffers()):
        if buffer.is_meta and name in buffers:
            owner, _, leaf = name.rpartition(".")
            base.get_submodule(owner).register_buffer(leaf, buffers[name].detach().to("cpu", copy=True),
                                                      persistent=False)
    left = [n for n, t in [*base.named_parameters(), *base.named_buffers()] if t.is_meta]
    if left or result.unexpected_keys:
        raise RuntimeError(f"merge_on_export: the gathered weights do not fit the model's architecture "
                           f"(not filled: {left[:3]}; unexpected: {result.unexpected_keys[:3]}).")


def _untie_output_embeddings(base: torch.nn.Module) -> None:
    """Give a tied lm_head its own weight, so merging a LoRA on it does not also change the embeddings."""
    out, inp = base.get_output_embeddings(), base.get_input_embeddings()
    out = getattr(out, "base_layer", out)  # a LoRA-wrapped lm_head
    configs = [base.config, getattr(base.config, "get_text_config", lambda: None)()]
    if out is None or inp is None or not any(getattr(c, "tie_word_embeddings", False) for c in configs if c):
        return
    if out.weight.data_ptr() == inp.weight.data_ptr():
        out.weight = torch.nn.Parameter(out.weight.detach().clone(), requires_grad=out.weight.requires_grad)
    for config in {id(c): c for c in configs if c is not None}.values():
        config.tie_word_embeddings = False
