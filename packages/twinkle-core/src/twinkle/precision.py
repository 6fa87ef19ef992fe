"""Mixed-precision plans shared by backends: which autocast dtype, whether a GradScaler is needed.

``no`` trains in the parameters' dtype; ``bf16`` and ``fp16`` run the forward under
``torch.autocast`` (CPU too) with fp32 master weights; ``fp16`` adds a GradScaler. ``fp8`` is
not something torch autocast offers: it resolves through the registry kind ``precision``
under the name the backend asks for (``fp8``: twinkle-megatron[fp8]'s Transformer Engine provider, for
Megatron's TE layers; ``torchao.fp8``: twinkle-hf[fp8]'s torchao float8 layers, for transformers models).
A provider is a class or object with ``is_available(device_type) -> bool``, ``prepare_model(model) ->
model`` and ``autocast() -> context manager``, optionally ``unavailable_reason(device_type) -> str | None``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from twinkle.errors import TwinkleError

MIXED_PRECISION = ("no", "fp8", "fp16", "bf16")


class PrecisionError(TwinkleError, ValueError):
    """A precision mode that cannot run here."""


@dataclass(frozen=True)
class PrecisionPlan:
    """What a backend needs to run one precision mode on one device type."""

    mode: str
    device_type: str
    autocast_dtype: Any = None
    use_grad_scaler: bool = False
    provider: Any = None

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """The context a forward (and its loss) runs under."""
        return self.autocast_factory()()

    def autocast_factory(self) -> Callable[[], contextlib.AbstractContextManager[Any]]:
        """A callable making :meth:`autocast`'s context, decided once (a backend keeps it for its hot path)."""
        if self.provider is not None:
            return self.provider.autocast
        if self.autocast_dtype is None:
            return contextlib.nullcontext
        import torch

        return functools.partial(torch.autocast, device_type=self.device_type, dtype=self.autocast_dtype)

    def make_grad_scaler(self, config: Mapping[str, Any] | None = None) -> Any:
        """A ``torch.amp.GradScaler`` for fp16 (configured by ``grad_scaler_config``), else None."""
        if not self.use_grad_scaler:
            if config:
                raise PrecisionError(
                    f"grad_scaler_config={dict(config)!r} was given but mixed_precision={self.mode!r} uses no "
                    "GradScaler; pass mixed_precision='fp16' or drop grad_scaler_config."
                )
            return None
        import torch

        try:
            return torch.amp.GradScaler(self.device_type, **dict(config or {}))
        except TypeError as exc:
            raise PrecisionError(f"grad_scaler_config={dict(config or {})!r} is not valid for "
                                 f"torch.amp.GradScaler: {exc}.") from exc


def plan_precision(mode: str, device_type: str, fp8_provider: str = "fp8") -> PrecisionPlan:
    """Check ``mode`` for ``device_type`` ('cpu', 'cuda', 'npu', ...) and return its plan.

    Args:
        mode: one of :data:`MIXED_PRECISION`.
        device_type: where the model runs.
        fp8_provider: the registered ``precision`` name that serves ``fp8`` for this backend.

    Returns:
        The plan; a :class:`PrecisionError` when the mode cannot run here.
    """
    if mode not in MIXED_PRECISION:
        raise PrecisionError(f"mixed_precision={mode!r} is not one of {', '.join(MIXED_PRECISION)}.")
    if mode == "no":
        return PrecisionPlan(mode, device_type)
    import torch

    if mode == "bf16":
        if device_type == "cuda" and not torch.cuda.is_bf16_supported():
            raise PrecisionError("mixed_precision='bf16' needs a GPU with bfloat16 support (Ampere or newer); "
                                 "use mixed_precision='fp16' on this GPU.")
        return PrecisionPlan(mode, device_type, autocast_dtype=torch.bfloat16)
    if mode == "fp16":
        return PrecisionPlan(mode, device_type, autocast_dtype=torch.float16, use_grad_scaler=True)
    return _plan_fp8(device_type, fp8_provider)


def _plan_fp8(device_type: str, name: str) -> PrecisionPlan:
    from twinkle.registry import resolve

    provider = resolve("precision", name)  # MissingBackendError names the package that provides it
    if isinstance(provider, type):
        provider = provider()
    if not provider.is_available(device_type):
        reason = getattr(provider, "unavailable_reason", lambda _: None)(device_type)
        raise PrecisionError(
            f"mixed_precision='fp8' cannot run on {device_type!r}: "
            f"{reason or 'FP8 needs a CUDA GPU with FP8 tensor cores (Ada/Hopper) and Transformer Engine'}. "
            "Use mixed_precision='bf16' (works on CPU too) or 'no'."
        )
    return PrecisionPlan("fp8", device_type, provider=provider)
