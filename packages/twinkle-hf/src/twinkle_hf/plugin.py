"""twinkle-hf's registrations (entry point ``twinkle = hf``). Specs are lazy: nothing heavy imports here."""

from __future__ import annotations

from twinkle.hookspecs import hookimpl


@hookimpl
def register_models():
    return {"TransformersModel": "twinkle_hf.model:TransformersModel"}
