"""``mixed_precision='fp8'`` for TransformersModel: torchao's float8 training linear layers (torchtitan's choice).

Transformer Engine's ``fp8_autocast`` (twinkle-megatron's provider) only changes TE layers, and an HF model
has none: under it an HF model would train in plain fp32. This provider swaps the model's ``nn.Linear``
layers for torchao's ``Float8Linear`` (dynamic scaling, recipe ``tensorwise``, ``rowwise`` or
``rowwise_with_gw_hp``) and runs the rest under bf16 autocast; the master weights stay fp32. The output
head and layers whose dimensions are not multiples of 16 (what FP8 GEMMs need) stay in bf16, as
torchtitan does. Registered (``torchao.fp8``) when torchao is installed (``pip install twinkle-hf[fp8]``);
it runs on CUDA GPUs with FP8 tensor cores (compute capability 8.9+: Ada, Hopper, Blackwell) and is
refused elsewhere with a message, never run silently in another precision.
"""

from __future__ import annotations

import contextlib
from typing import Any, Literal

import torch

from twinkle.utils.checks import check_choice

Recipe = Literal["tensorwise", "rowwise", "rowwise_with_gw_hp"]
RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
#: FP8 GEMMs (torch._scaled_mm) need both dimensions of the weight to be multiples of 16
ALIGNMENT = 16
#: layers left in bf16: the output head (its logits feed the loss; torchtitan keeps it out too)
SKIPPED = ("lm_head", "output", "score")


class TorchaoFP8:
    """FP8 training of a transformers model through ``torchao.float8.convert_to_float8_training``.

    Args:
        recipe: torchao's recipe name: ``tensorwise`` (one scale per tensor, fastest), ``rowwise`` (one per
            row, more accurate) or ``rowwise_with_gw_hp`` (rowwise, weight gradient in high precision).
    """

    def __init__(self, recipe: Recipe = "tensorwise") -> None:
        self.recipe = check_choice(recipe, "fp8 recipe", RECIPES)

    def unavailable_reason(self, device_type: str) -> str | None:
        """Why FP8 cannot run on ``device_type`` here (None: it can)."""
        if device_type != "cuda":
            return f"FP8 training needs a CUDA GPU with FP8 tensor cores; this process runs on {device_type!r}"
        if not torch.cuda.is_available():
            return "no CUDA device is visible"
        capability = torch.cuda.get_device_capability()
        if capability < (8, 9):
            return (f"this GPU ({torch.cuda.get_device_name()}, compute capability {capability[0]}.{capability[1]}) "
                    "has no FP8 tensor cores (8.9+: Ada, Hopper, Blackwell)")
        return None

    def is_available(self, device_type: str) -> bool:
        return self.unavailable_reason(device_type) is None

    def config(self) -> Any:
        from torchao.float8 import Float8LinearConfig

        return Float8LinearConfig.from_recipe_name(self.recipe)

    def prepare_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """Swap the eligible ``nn.Linear`` layers (in place) for ``Float8Linear``; returns the model."""
        from torchao.float8 import convert_to_float8_training

        return convert_to_float8_training(model, config=self.config(), module_filter_fn=fp8_eligible)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """bf16 autocast around the float8 layers (torchao's high-precision dtype)."""
        return torch.autocast(device_type="cuda", dtype=torch.bfloat16)


def fp8_eligible(module: torch.nn.Module, fqn: str) -> bool:
    """Whether ``module`` (named ``fqn``) becomes a Float8Linear: a Linear with 16-aligned dimensions, not the head."""
    if not isinstance(module, torch.nn.Linear):
        return False
    if fqn.rsplit(".", 1)[-1] in SKIPPED:
        return False
    return module.in_features % ALIGNMENT == 0 and module.out_features % ALIGNMENT == 0
