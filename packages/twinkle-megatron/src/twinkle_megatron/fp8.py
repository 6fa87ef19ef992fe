"""The ``fp8`` precision provider: Transformer Engine's FP8 autocast with a configurable recipe.

Registered only when TE's PyTorch extension is installed (see ``plugin.py``). MegatronModel does
not go through ``autocast()``: with ``mixed_precision='fp8'`` it sets megatron-core's own
``fp8='hybrid'`` and the TE layers apply the recipe. The provider serves the precision protocol of
``twinkle.precision`` (``is_available``, ``prepare_model``, ``autocast``) for any backend.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from twinkle.utils.checks import check_choice
from twinkle_megatron.te import import_te

FORMATS = ("HYBRID", "E4M3")


class TransformerEngineFP8:
    """FP8 through ``transformer_engine.pytorch.fp8_autocast`` with a DelayedScaling recipe."""

    def __init__(self, fp8_format: str = "HYBRID", amax_history_len: int = 1024,
                 amax_compute_algo: str = "max", margin: int = 0) -> None:
        self.fp8_format = check_choice(fp8_format, "fp8_format", FORMATS)
        self.amax_history_len = amax_history_len
        self.amax_compute_algo = amax_compute_algo
        self.margin = margin

    def is_available(self, device_type: str) -> bool:
        """CUDA, TE importable, and a GPU with FP8 tensor cores (TE's own check)."""
        te, _ = import_te()
        if te is None or device_type != "cuda":
            return False
        try:
            available, _ = te.fp8.check_fp8_support()
        except Exception:
            return False
        return bool(available)

    def recipe(self) -> Any:
        from transformer_engine.common import recipe

        return recipe.DelayedScaling(fp8_format=getattr(recipe.Format, self.fp8_format), margin=self.margin,
                                     amax_history_len=self.amax_history_len,
                                     amax_compute_algo=self.amax_compute_algo)

    def prepare_model(self, model: Any) -> Any:
        return model

    def autocast(self) -> AbstractContextManager[Any]:
        te, why = import_te()
        if te is None:
            raise RuntimeError(f"fp8 autocast needs Transformer Engine: {why}.")
        return te.fp8_autocast(enabled=True, fp8_recipe=self.recipe())
