"""memory_efficient_init: rank 0 reads the full weights, the other ranks build the model on the meta
device (no memory) and receive their parameters from rank 0 once the model is wrapped.

DDP broadcasts rank 0's parameters and buffers when it is constructed, so the other ranks only
need storage (``to_empty``). FSDP2 ranks get their shards with ``set_model_state_dict(...,
full_state_dict=True, broadcast_from_rank0=True)``; buffers outside the state dict (rotary
``inv_freq``) are broadcast one by one.
"""

from __future__ import annotations

from typing import Any

import torch

from twinkle import collective


def load_rank0_only(model_cls: Any, model_id: str | None, config: Any, kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """Rank 0: the usual load. Other ranks: the same architecture on the meta device."""
    from transformers import AutoConfig

    from twinkle_hf.model import loading
    from twinkle_hf.model.meta import from_config

    if collective.rank() == 0:
        return loading.load_hf_model(model_cls, model_id, config, kwargs)
    cls = loading.choose_model_cls(model_cls, model_id, config, bool(kwargs.get("trust_remote_code", False)))
    kwargs = dict(kwargs)
    if "torch_dtype" in kwargs and "dtype" not in kwargs:
        kwargs["dtype"] = kwargs.pop("torch_dtype")
    kwargs.setdefault("dtype", torch.float32)
    path = None
    if model_id is not None:
        path = loading.resolve_model_path(model_id)
        loading.check_not_adapter_dir(path)
        config = config if config is not None else AutoConfig.from_pretrained(path)
    if config is None:
        raise ValueError("TransformersModel needs model_id= (hub id or local directory) or config= (random init).")
    for key in ("trust_remote_code", "attn_implementation"):
        if key in kwargs and key == "attn_implementation":
            config._attn_implementation = kwargs[key]
    dtype = kwargs.pop("dtype")
    with torch.device("meta"):
        model = from_config(cls, config, {"dtype": dtype})
    return model, path


def share_rank0_generator() -> None:
    """Every rank continues from rank 0's torch CPU generator.

    In a plain build every rank loads the same way and ends with the same generator state. Here only rank 0
    loaded (a random init draws from the generator, a meta build does not), so the other ranks take rank 0's
    state: what is drawn next -- peft's init of adapters and multi-LoRA slots, which slots snapshot as their
    initial weights at construction -- is rank 0's and a plain build's on every rank.
    """
    if collective.world_size() > 1:
        torch.set_rng_state(collective.broadcast_object(torch.get_rng_state() if collective.rank() == 0 else None))


def on_meta(model: torch.nn.Module) -> bool:
    return any(t.is_meta for t in (*model.parameters(), *model.buffers()))


def before_wrap(backend: Any) -> dict[str, torch.Tensor] | None:
    """Give meta ranks storage (DDP) and keep rank 0's full state for the FSDP2 broadcast.

    Rank 0's full state must outlive the sharding (which replaces the module's parameters) and must not
    pin the unsharded weights on the accelerator: CPU tensors are kept as they are (no copy; the module
    stays on the CPU until it is sharded), anything on a device is copied to the CPU.
    """
    model = backend.module
    if backend.dist_plan.kind == "ddp":
        if on_meta(model):
            model.to_empty(device=backend.device)
        return None
    if collective.rank() != 0:
        return None
    return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}


def after_wrap(backend: Any, full_state: dict[str, torch.Tensor] | None) -> None:
    """FSDP2: fill every rank's shards (and the non-state buffers) from rank 0's full weights."""
    if backend.dist_plan.kind == "ddp":
        return  # DDP's constructor already broadcast rank 0's parameters and buffers
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    model = backend.module
    if on_meta(model):
        model.to_empty(device=backend.device)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full_state if full_state is not None else {}, options=options)
    persistent = set(model.state_dict())
    for name, buffer in model.named_buffers():
        if name not in persistent:
            collective.broadcast_(buffer, src=0)
