"""The ops kernelize knows: which modules each one matches and where a kernel plugs in.

Three levels:

- ``module``: the matched module's forward (or class) is replaced — ``rms_norm``, ``swiglu``;
- ``forward_global``: the matched module keeps its forward, but the global helper that forward
  calls is rebound for that module only — ``rotary_embedding`` (``apply_rotary_pos_emb``),
  ``attention`` (transformers' ``ALL_ATTENTION_FUNCTIONS``);
- ``function``: loss-level ops that no module holds — ``cross_entropy``,
  ``fused_linear_cross_entropy``; kernelize picks the function and losses call it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twinkle.kernel.choice import KernelNotApplicable
from twinkle.kernel.patching import forward_global
from twinkle.kernel.probes import is_silu

LEVELS = ("module", "forward_global", "function")


@dataclass(frozen=True)
class OpSpec:
    """One op: how to find its modules and, for ``forward_global`` ops, which global to rebind."""

    name: str
    level: str
    matches: Callable[[Any], bool] | None = None
    global_name: str | None = None
    wrap: Callable[[Callable[..., Any], Any], Any] | None = None  # (kernel fn, original global) -> new global
    description: str = ""


def is_rms_norm(module: Any) -> bool:
    return type(module).__name__.endswith("RMSNorm")


def is_gated_silu_mlp(module: Any) -> bool:
    """A SwiGLU MLP: ``down_proj(act_fn(gate_proj(x)) * up_proj(x))`` with a SiLU ``act_fn``."""
    import torch

    parts = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(p, torch.nn.Module) for p in parts):
        return False
    act = getattr(module, "act_fn", None)
    return act is not None and is_silu(act)


def _uses_global(name: str) -> Callable[[Any], bool]:
    def matches(module: Any) -> bool:
        return forward_global(type(module), name) is not None

    matches.__name__ = f"uses_{name}"
    return matches


class FixedAttentionInterface:
    """Stands in for transformers' ``ALL_ATTENTION_FUNCTIONS`` inside one module's forward.

    Every lookup returns the kernel; when the kernel raises :class:`KernelNotApplicable` for a call
    (a sliding window it does not support, say) the implementation the model was configured with
    runs instead.
    """

    def __init__(self, kernel: Callable[..., Any], original: Any) -> None:
        self.kernel = kernel
        self.original = original

    def get_interface(self, attn_implementation: str | None = None, default: Any = None) -> Callable[..., Any]:
        fallback = default
        if self.original is not None and hasattr(self.original, "get_interface"):
            fallback = self.original.get_interface(attn_implementation, default)
        kernel = self.kernel

        def attention(*args: Any, **kwargs: Any) -> Any:
            try:
                return kernel(*args, **kwargs)
            except KernelNotApplicable:
                if fallback is None:
                    raise
                return fallback(*args, **kwargs)

        return attention

    def __getitem__(self, key: str) -> Callable[..., Any]:
        default = self.original[key] if self.original is not None and key in self.original else None
        return self.get_interface(None, default)

    def get(self, key: str, default: Any = None) -> Callable[..., Any]:
        return self[key] if default is None else self.get_interface(None, default)

    def __contains__(self, key: object) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        if name in ("kernel", "original"):
            raise AttributeError(name)
        return getattr(self.original, name)


OPS: dict[str, OpSpec] = {
    "rms_norm": OpSpec("rms_norm", "module", is_rms_norm, description="modules whose class name ends with RMSNorm"),
    "swiglu": OpSpec("swiglu", "module", is_gated_silu_mlp,
                     description="gated MLPs: down_proj(silu(gate_proj(x)) * up_proj(x))"),
    "rotary_embedding": OpSpec("rotary_embedding", "forward_global", _uses_global("apply_rotary_pos_emb"),
                               global_name="apply_rotary_pos_emb",
                               description="modules whose forward calls apply_rotary_pos_emb(q, k, cos, sin)"),
    "attention": OpSpec("attention", "forward_global", _uses_global("ALL_ATTENTION_FUNCTIONS"),
                        global_name="ALL_ATTENTION_FUNCTIONS", wrap=FixedAttentionInterface,
                        description="modules dispatching through transformers' ALL_ATTENTION_FUNCTIONS"),
    "cross_entropy": OpSpec("cross_entropy", "function",
                            description="cross_entropy(logits, labels, ignore_index=-100, reduction='mean')"),
    "fused_linear_cross_entropy": OpSpec(
        "fused_linear_cross_entropy", "function",
        description="f(hidden (N,H), weight (V,H), labels (N,), bias=None, *, ignore_index, reduction) "
                    "-> FusedCEOutput(loss, num_correct, num_tokens)"),
}

#: Other names accepted in a config.
ALIASES: dict[str, str] = {"mlp": "swiglu", "rope": "rotary_embedding", "rotary": "rotary_embedding",
                           "fused_ce": "fused_linear_cross_entropy"}


def canonical_op(name: str) -> str:
    """The op ``name`` stands for, or a ValueError listing the known ops."""
    op = ALIASES.get(name, name)
    if op not in OPS:
        raise ValueError(f"Unknown kernel op {name!r}; twinkle knows {', '.join(OPS)} "
                         f"(aliases: {', '.join(f'{a}={o}' for a, o in ALIASES.items())}).")
    return op
