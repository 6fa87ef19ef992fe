"""twinkle-npu's registrations (entry point ``twinkle = npu``). torch_npu is never imported here."""

from __future__ import annotations

from twinkle.hookspecs import hookimpl


@hookimpl
def register_platforms():
    return {"npu": "twinkle_npu.platform:NPUPlatform"}


@hookimpl
def register_kernels():
    # torch_npu choices, first in every chain on device npu; see twinkle_npu/kernels/choices.py
    names = ("rms_norm", "swiglu", "rotary_embedding", "attention")
    return {f"npu.{op}": f"twinkle_npu.kernels.choices:NPU_{op.upper()}" for op in names}
