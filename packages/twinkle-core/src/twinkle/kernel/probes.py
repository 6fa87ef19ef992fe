"""Small numerical probes that tell whether a model's module or function has the standard semantics.

A fused kernel is only a drop-in replacement when the code it replaces computes the same thing.
Class names are not enough (``GemmaRMSNorm`` scales by ``1 + weight``, some rotary helpers rotate a
partial head, some MLPs gate with GELU), so each probe runs the original on a tiny input made from a
private generator (the global RNG is untouched) and compares it with the reference formula.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

_RMS_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ROTARY_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class RMSNormSpec:
    """What a kernel needs to reproduce an RMSNorm: ``y = x / rms(x) * (offset + weight)``."""

    eps: float
    offset: float


def _generator(device: Any):
    import torch

    try:
        return torch.Generator(device=device).manual_seed(1234)
    except RuntimeError:
        return torch.Generator().manual_seed(1234)


def _plain_tensor(t: Any) -> bool:
    import torch

    return isinstance(t, torch.Tensor) and t.device.type != "meta" and not hasattr(t, "placements")


def rms_norm_spec(module: Any) -> RMSNormSpec | None:
    """eps and offset (0: llama style, 1: gemma style) of an RMSNorm module, or None if neither fits."""
    if module in _RMS_CACHE:
        return _RMS_CACHE[module]
    spec = _probe_rms_norm(module)
    _RMS_CACHE[module] = spec
    return spec


def _probe_rms_norm(module: Any) -> RMSNormSpec | None:
    import torch

    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not _plain_tensor(weight) or weight.dim() != 1 or not isinstance(eps, (int, float)):
        return None
    x = torch.randn(3, weight.shape[0], generator=_generator(weight.device), device=weight.device)
    with torch.no_grad():
        try:
            got = type(module).forward(module, x).float()
        except Exception:
            return None
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        w = weight.detach().float()
        tol = 1e-4 if weight.dtype == torch.float32 else 2e-2
        for offset in (0.0, 1.0):
            if got.shape == normed.shape and torch.allclose(got, normed * (offset + w), rtol=tol, atol=tol):
                return RMSNormSpec(float(eps), offset)
    return None


def is_standard_rms_norm(module: Any) -> bool:
    """``accepts`` check for rms_norm kernels that take eps and an offset of 0 or 1."""
    return rms_norm_spec(module) is not None


def rotate_half(x: Any) -> Any:
    import torch

    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def reference_rotary(q: Any, k: Any, cos: Any, sin: Any, unsqueeze_dim: int = 1) -> tuple[Any, Any]:
    """Rotate-half RoPE on the first ``cos.shape[-1]`` channels of each head, the rest passed through."""
    import torch

    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    rot = cos.shape[-1]

    def apply(x: Any) -> Any:
        x_rot, x_pass = x[..., :rot], x[..., rot:]
        out = x_rot * cos + rotate_half(x_rot) * sin
        return torch.cat((out, x_pass), dim=-1) if x_pass.shape[-1] else out

    return apply(q), apply(k)


def is_standard_rotary(fn: Any) -> bool:
    """Whether ``fn(q, k, cos, sin)`` is rotate-half RoPE (full head; partial heads must pass the rest through)."""
    try:
        if fn not in _ROTARY_CACHE:
            _ROTARY_CACHE[fn] = _probe_rotary(fn)
        return _ROTARY_CACHE[fn]
    except TypeError:  # not weak-referenceable: probe every time
        return _probe_rotary(fn)


def _probe_rotary(fn: Any) -> bool:
    import torch

    g = _generator("cpu")
    q, k = torch.randn(1, 2, 3, 8, generator=g), torch.randn(1, 1, 3, 8, generator=g)
    for width, must_run in ((8, True), (4, False)):
        cos, sin = torch.randn(1, 3, width, generator=g), torch.randn(1, 3, width, generator=g)
        try:
            got = fn(q, k, cos, sin)
        except Exception:
            if must_run:
                return False
            continue
        want = reference_rotary(q, k, cos, sin)
        if not (isinstance(got, (tuple, list)) and len(got) == 2
                and all(a.shape == b.shape and torch.allclose(a, b, atol=1e-5) for a, b in zip(got, want))):
            return False
    return True


def module_uses_standard_rotary(module: Any) -> bool:
    """``accepts`` check for rotary kernels: the module's forward calls a standard ``apply_rotary_pos_emb``."""
    from twinkle.kernel.patching import forward_global

    fn = forward_global(type(module), "apply_rotary_pos_emb")
    return fn is not None and is_standard_rotary(fn)


def is_silu(act: Any) -> bool:
    """Whether the activation callable computes SiLU (swish)."""
    import torch
    import torch.nn.functional as F

    if not callable(act):
        return False
    x = torch.linspace(-6.0, 6.0, 25)
    try:
        with torch.no_grad():
            return bool(torch.allclose(act(x), F.silu(x), atol=1e-5))
    except Exception:
        return False
