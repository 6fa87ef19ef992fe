"""twinkle's Megatron-Core backend: MegatronModel, HF<->megatron weight bridge, fp8 via Transformer Engine.

Importing this package is cheap; megatron-core is imported when a model is built.
"""

__version__ = "0.1.0"
