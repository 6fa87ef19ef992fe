"""Building a model on the meta device, and the dtypes its weights are held in.

Under FSDP2 no rank should ever hold the whole model (docs/distributed.md, sharded loading), so the model is built with
its parameters on the meta device (no storage; buffers such as rotary ``inv_freq`` are real and
tiny), adapters are added, the model is sharded, and each rank then reads only its own shards
from the checkpoint files (``twinkle_hf.distributed.shard_load``). peft creates an adapter's
weights on the CPU, initialises them and then moves them to the base layer's device — the meta
device here, which would throw the initial values away — so while adapters are added to a meta
model they stay where peft made them (:func:`adapters_stay_real`), with the very values a
plain load gives.

Mixed precision with adapters: the frozen base weights are only ever read, so under
``mixed_precision='bf16'|'fp16'`` they are held in that dtype (2 bytes per parameter instead of 4);
trainable parameters stay float32 master weights (:func:`hold_frozen_in`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from twinkle.log import get_logger
from twinkle_hf.model.weights import weight_files

logger = get_logger("twinkle_hf")

#: from_pretrained options the meta build understands; any other option takes the plain load path.
META_KWARGS = ("dtype", "torch_dtype", "attn_implementation", "trust_remote_code")
_LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}


def on_meta(model: torch.nn.Module) -> bool:
    """Whether any parameter has no storage yet."""
    return any(p.is_meta for p in model.parameters())


def file_key(name: str) -> str:
    """The checkpoint key of a parameter or buffer of a (possibly peft-wrapped) transformers model."""
    if name.startswith("base_model.model."):
        name = name[len("base_model.model."):]
    name = name.replace(".base_layer.", ".").replace(".original_module.", ".")
    if ".modules_to_save." in name:  # peft's trainable copy starts from the base module's weights
        head, tail = name.split(".modules_to_save.", 1)
        name = f"{head}.{tail.split('.', 1)[1]}"
    return name


def aliases(model: torch.nn.Module) -> dict[int, list[str]]:
    """Every name each parameter is reachable under (tied weights have several), by parameter id."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return names


def missing_from_files(model: torch.nn.Module, keys: dict[str, Any]) -> list[str]:
    """Parameters of ``model`` that no name of theirs finds in the checkpoint ``keys``."""
    return sorted(names[0] for names in aliases(model).values()
                  if not any(file_key(n) in keys for n in names))


def unexpected_in_files(model: torch.nn.Module, keys: dict[str, Any]) -> list[str]:
    """Checkpoint ``keys`` that no parameter or persistent buffer of ``model`` reads."""
    known = {file_key(n) for n in model.state_dict(keep_vars=True)}
    return sorted(k for k in keys if k not in known)


def from_config(cls: Any, config: Any, kwargs: dict[str, Any]) -> torch.nn.Module:
    """A model of class ``cls`` (an Auto class or a concrete one) built from ``config``, weights initialised
    (or left without storage inside a meta context)."""
    if hasattr(cls, "from_config"):  # Auto classes
        return cls.from_config(config, **kwargs)
    return cls._from_config(config, **kwargs)


def build_on_meta(cls: Any, path: str, config: Any, kwargs: dict[str, Any],
                  strict: bool = False) -> tuple[torch.nn.Module | None, str]:
    """``(model, '')`` with its parameters on the meta device, or ``(None, why)`` when the checkpoint at ``path``
    cannot be read shard by shard (no safetensors, options only ``from_pretrained`` understands, key names
    transformers would convert; with ``strict``, tensors the model has no place for); the caller then loads it
    the plain way (which reports what does not fit under ``strict``)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig

    other = sorted(set(kwargs) - set(META_KWARGS))
    if other:
        return None, f"from_pretrained options {other}"
    keys = weight_files(path)
    if keys is None:
        return None, "no safetensors weights"
    trust = bool(kwargs.get("trust_remote_code", False))
    if config is None:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
    build_kwargs = {"dtype": kwargs.get("dtype", kwargs.get("torch_dtype", torch.float32))}
    for key in ("attn_implementation", "trust_remote_code"):
        if key in kwargs:
            build_kwargs[key] = kwargs[key]
    with init_empty_weights(include_buffers=False):
        model = from_config(cls, config, build_kwargs)
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # accelerate's meta context re-creates parameters, which unties a tied head
    missing = missing_from_files(model, keys)
    if missing:
        return None, f"{len(missing)} parameters are not stored under their own names (e.g. {missing[:2]})"
    unexpected = unexpected_in_files(model, keys) if strict else []
    if unexpected:
        return None, f"{len(unexpected)} stored tensors are not the model's (e.g. {unexpected[:2]})"
    _load_generation_config(model, path)
    return model, ""


def _load_generation_config(model: torch.nn.Module, path: str) -> None:
    if not (Path(path) / "generation_config.json").is_file() or not hasattr(model, "generation_config"):
        return
    from transformers import GenerationConfig

    with contextlib.suppress(OSError, ValueError):
        model.generation_config = GenerationConfig.from_pretrained(path)


@contextlib.contextmanager
def adapters_stay_real(model: torch.nn.Module) -> Iterator[None]:
    """While adding adapters to a meta model, keep their initialised weights on the CPU (see module docstring).

    peft moves a new adapter to its base layer's device in two places: the layer's
    ``_move_adapter_to_device_of_base_layer`` and the tuner's ``module.to(base_weight.device)``.
    For the duration, the first is told the CPU and a module ``.to(meta)`` of a module with real
    weights keeps its device (a dtype change still applies). Both are restored on exit.
    """
    if not on_meta(model):
        yield
        return
    from peft.tuners.tuners_utils import BaseTunerLayer

    move, module_to = BaseTunerLayer._move_adapter_to_device_of_base_layer, torch.nn.Module.to

    def move_but_not_to_meta(self: Any, adapter_name: str, device: Any = None) -> None:
        weight = getattr(self.get_base_layer(), "weight", None)
        if device is None and weight is not None and weight.is_meta:
            device = torch.device("cpu")  # peft's own dtype handling still runs
        move(self, adapter_name, device=device)

    def to_but_not_meta(self: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.nn.Module:
        device, dtype, non_blocking, _ = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "meta" and any(not p.is_meta for p in self.parameters()):
            return module_to(self, dtype=dtype, non_blocking=non_blocking) if dtype is not None else self
        return module_to(self, *args, **kwargs)

    BaseTunerLayer._move_adapter_to_device_of_base_layer = move_but_not_to_meta
    torch.nn.Module.to = to_but_not_meta
    try:
        yield
    finally:
        BaseTunerLayer._move_adapter_to_device_of_base_layer = move
        torch.nn.Module.to = module_to


def hold_frozen_in(model: torch.nn.Module, mixed_precision: str, trainable: list[torch.nn.Parameter]) -> None:
    """Frozen floating-point weights in the mixed-precision dtype, ``trainable`` ones in float32 (in place).

    ``p.data`` is replaced, so tied parameters stay tied. A no-op without a bf16/fp16 mode.
    """
    dtype = _LOW_PRECISION.get(mixed_precision)
    if dtype is None:
        return
    with torch.no_grad():
        keep = {id(p) for p in trainable}
        for param in model.parameters():
            if id(param) in keep:
                if param.dtype in _LOW_PRECISION.values():
                    param.data = param.data.to(torch.float32)
            elif not param.requires_grad and param.is_floating_point() and param.dtype == torch.float32:
                param.data = param.data.to(dtype)
