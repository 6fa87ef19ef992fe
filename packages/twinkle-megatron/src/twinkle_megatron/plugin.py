"""twinkle-megatron's registrations (entry point ``twinkle = megatron``). Specs are lazy."""

from __future__ import annotations

from twinkle.hookspecs import hookimpl


@hookimpl
def register_models():
    return {
        "MegatronModel": "twinkle_megatron.model:MegatronModel",
        "MultiLoraMegatronModel": "twinkle_megatron.model:MultiLoraMegatronModel",
    }
