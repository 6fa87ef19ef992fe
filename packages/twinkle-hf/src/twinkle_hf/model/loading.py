"""Turning TransformersModel's constructor arguments into a loaded ``transformers`` module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, PretrainedConfig, PreTrainedModel

from twinkle.log import get_logger
from twinkle_hf.model.meta import build_on_meta, from_config
from twinkle_hf.model.vision import model_class_for

ASSET_PREFIX = "twinkle://"
logger = get_logger("twinkle_hf")


def resolve_model_cls(model_cls: Any) -> Any:
    """A transformers class from a class or its name (``'AutoModelForCausalLM'``, ``'Qwen2ForCausalLM'``)."""
    if isinstance(model_cls, str):
        cls = getattr(transformers, model_cls, None)
        if cls is None or not isinstance(cls, type):
            raise ValueError(
                f"model_cls={model_cls!r} is not a class exported by transformers {transformers.__version__}; "
                "pass e.g. 'AutoModelForCausalLM', 'AutoModel', or the class itself."
            )
        return cls
    if not isinstance(model_cls, type):
        raise TypeError(f"model_cls must be a transformers model class or its name, got {model_cls!r}.")
    return model_cls


def choose_model_cls(model_cls: Any, model_id: str | None, config: PretrainedConfig | None,
                     trust_remote_code: bool = False) -> Any:
    """:func:`resolve_model_cls`, with a vision-language model's image-text-to-text class in place of the
    default ``AutoModelForCausalLM`` (read from ``config``, else from the model directory's config.json,
    with the caller's ``trust_remote_code`` for a remote-code architecture)."""
    cls = resolve_model_cls(model_cls)
    if cls is not transformers.AutoModelForCausalLM:
        return cls
    if config is None and model_id is not None:
        path = Path(resolve_model_path(model_id)) / "config.json"
        config = AutoConfig.from_pretrained(path.parent, trust_remote_code=trust_remote_code) \
            if path.is_file() else None
    return model_class_for(cls, config) if config is not None else cls


def resolve_model_path(model_id: str) -> str:
    """A local directory for ``model_id`` (``ms://``, ``hf://``, ``twinkle://`` ids or a local path)."""
    from twinkle.hub import resolve_path

    return str(resolve_path(model_id, repo_type="model"))


def check_not_adapter_dir(path: str) -> None:
    """A LoRA checkpoint has no full weights: say how to use it instead of failing deep in transformers."""
    directory = Path(path)
    if (directory / "adapter_config.json").is_file() and not (directory / "config.json").is_file():
        raise ValueError(
            f"{path!r} holds a LoRA adapter, not a full model. Build TransformersModel from the base model, then "
            f"call add_adapter_to_model(name, {path!r}) or resume_from_checkpoint({path!r}, adapter_name=name)."
        )


def load_hf_model(model_cls: Any, model_id: str | None, config: PretrainedConfig | None,
                  kwargs: dict[str, Any], strict: bool = False) -> tuple[PreTrainedModel, str | None]:
    """Load pretrained weights (``model_id``) or build from ``config`` (random init).

    Weights default to float32 (the master copy mixed precision trains); pass ``dtype=`` to override.
    A vision-language config with the default ``AutoModelForCausalLM`` loads ``AutoModelForImageTextToText``.
    ``strict``: weights that do not fit the model (missing, unexpected or mis-shaped tensors, which
    transformers would initialise randomly or drop with a warning) are an error.
    Returns the model and the local path it came from.
    """
    cls = choose_model_cls(model_cls, model_id, config, bool(kwargs.get("trust_remote_code", False)))
    kwargs = dict(kwargs)
    if "torch_dtype" in kwargs and "dtype" not in kwargs:
        kwargs["dtype"] = kwargs.pop("torch_dtype")
    kwargs.setdefault("dtype", torch.float32)
    if model_id is not None:
        path = resolve_model_path(model_id)
        check_not_adapter_dir(path)
        if str(model_id).startswith(ASSET_PREFIX) and not has_weights(path):
            # twinkle's embedded models ship a config (and tokenizer) only: random init by design
            config = config if config is not None else AutoConfig.from_pretrained(path)
            return from_config(cls, config, kwargs), path
        if config is not None:
            kwargs["config"] = config
        if not strict:
            return cls.from_pretrained(path, **kwargs), path
        model, info = cls.from_pretrained(path, output_loading_info=True, **kwargs)
        check_loading_info(info, path)
        return model, path
    if config is None:
        raise ValueError("TransformersModel needs model_id= (hub id or local directory) or config= (random init).")
    return from_config(cls, config, kwargs), None


def build_for_sharding(model_cls: Any, model_id: str, config: PretrainedConfig | None,
                       kwargs: dict[str, Any], strict: bool = False) -> tuple[PreTrainedModel, str] | None:
    """``(model on the meta device, weights directory)`` for FSDP2, whose ranks then read only their shards.

    None when there is nothing to read shard by shard (a config-only asset: random init) or the
    checkpoint must be loaded whole (said in one info line); the caller then loads it the plain way.
    """
    cls = choose_model_cls(model_cls, model_id, config, bool(kwargs.get("trust_remote_code", False)))
    path = resolve_model_path(model_id)
    check_not_adapter_dir(path)
    if not has_weights(path):
        return None
    model, why = build_on_meta(cls, path, config, kwargs, strict=strict)
    if model is None:
        logger.info("FSDP2: %s cannot be read shard by shard (%s); every rank loads it whole, then shards it.",
                    model_id, why)
        return None
    return model, path


def check_loading_info(info: dict[str, Any], path: str) -> None:
    """Refuse a load that left weights missing, unused or mis-shaped (transformers only warns)."""
    problems = [f"{len(info[key])} {what} (e.g. {sorted(map(str, info[key]))[:3]})"
                for key, what in (("missing_keys", "missing"), ("unexpected_keys", "unexpected"),
                                  ("mismatched_keys", "mis-shaped")) if info.get(key)]
    if problems:
        raise ValueError(f"The weights in {path!r} do not fit the model: {'; '.join(problems)} tensors. "
                         "Load a checkpoint of this architecture, or pass strict_load=False to accept it "
                         "(missing weights are then randomly initialised).")


def has_weights(path: str) -> bool:
    """Whether a model directory holds weight files (safetensors, bin, or an index of either)."""
    directory = Path(path)
    return directory.is_dir() and any(
        p.suffix in (".safetensors", ".bin", ".pt", ".pth") or p.name.endswith(".index.json")
        for p in directory.iterdir()
    )


def check_strategy(strategy: str, world_size: int) -> None:
    """Validate ``strategy`` for ``world_size`` processes (the plan itself lives in twinkle_hf.distributed)."""
    from twinkle_hf.distributed.plan import make_plan

    make_plan(strategy, None, world_size)
