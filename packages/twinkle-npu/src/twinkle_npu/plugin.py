"""twinkle-npu's registrations (entry point ``twinkle = npu``). torch_npu is never imported here."""

from __future__ import annotations

from twinkle.hookspecs import hookimpl


@hookimpl
def register_platforms():
    return {"npu": "twinkle_npu.platform:NPUPlatform"}
