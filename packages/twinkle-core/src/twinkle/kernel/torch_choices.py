"""twinkle-core's torch choices: the end of every chain, on every device.

For module ops they are *references*: the model keeps its own (transformers') implementation.
For the loss-level ops they point at plain-torch functions in this package.
"""

from __future__ import annotations

from twinkle.kernel.choice import ANY_DEVICE, KernelChoice

_TORCH = dict(provider="torch", devices=(ANY_DEVICE,), priority=0)

TORCH_RMS_NORM = KernelChoice(op="rms_norm", description="the model's own RMSNorm", **_TORCH)
TORCH_SWIGLU = KernelChoice(op="swiglu", description="the model's own MLP", **_TORCH)
TORCH_ROTARY_EMBEDDING = KernelChoice(op="rotary_embedding", description="the model's apply_rotary_pos_emb", **_TORCH)
TORCH_ATTENTION = KernelChoice(op="attention", description="the model's configured attention implementation",
                               **_TORCH)
TORCH_CROSS_ENTROPY = KernelChoice(op="cross_entropy", function="twinkle.kernel.cross_entropy:cross_entropy",
                                   description="F.cross_entropy on materialised logits", **_TORCH)
TORCH_FUSED_LINEAR_CROSS_ENTROPY = KernelChoice(
    op="fused_linear_cross_entropy", function="twinkle.kernel.fused_linear_ce:fused_linear_cross_entropy",
    description="chunked over tokens, never materialises the (N, V) logits", **_TORCH)
