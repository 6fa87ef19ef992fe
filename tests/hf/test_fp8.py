"""mixed_precision='fp8' of TransformersModel: torchao's Float8Linear layers, or a clear refusal, never fp32.

torchao's float8 layers run on the CPU too (torch has a CPU ``_scaled_mm``), so the module swap, the recipe
and the FP8 GEMMs of a training step are checked here; only the speed needs a GPU. On the CPU the model is
refused unless a test lets the provider run there.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from hf_testing import make_batch, make_model, tiny_config
from transformers import AutoModelForCausalLM

import twinkle_hf.plugin
from twinkle.errors import MissingBackendError
from twinkle.hookspecs import hookimpl
from twinkle.plugins import Provenance, create_plugin_manager
from twinkle.precision import PrecisionError
from twinkle.registry import Registry, set_registry
from twinkle_hf.fp8 import TorchaoFP8, fp8_eligible

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@contextlib.contextmanager
def _registry(*plugins: object):
    """Core + twinkle-hf + ``plugins`` only (no other installed entry points, e.g. Transformer Engine's fp8)."""
    extra = [(twinkle_hf.plugin, Provenance("hf", "twinkle-hf", "0.1.0"))]
    extra += [(plugin, Provenance(f"test{i}", f"test{i}", "1.0")) for i, plugin in enumerate(plugins)]
    old = set_registry(Registry(create_plugin_manager(entry_points=False, extra=extra)))
    try:
        yield
    finally:
        set_registry(old)


class _AvailableEverywhere:
    """An ``fp8`` provider (Transformer Engine's name) that says it can run here and wraps nothing."""

    def is_available(self, device_type: str) -> bool:
        return True

    def prepare_model(self, model):
        return model

    def autocast(self):
        return contextlib.nullcontext()


class _TePlugin:
    @hookimpl
    def register_precisions(self):
        return {"fp8": f"{__name__}:_AvailableEverywhere"}


_FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)


class _Fp8Matmuls(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the matmuls run inside the block whose two operands hold float8 data (torchao's
    ``Float8TrainingTensor``, which its own dispatch turns into ``torch._scaled_mm``)."""

    def __init__(self) -> None:
        super().__init__()
        self.fp8 = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.mm.default and all(getattr(a, "_data", a).dtype in _FP8 for a in args[:2]):
            self.fp8 += 1
        return func(*args, **(kwargs or {}))


def test_transformers_model_never_takes_the_transformer_engine_provider(monkeypatch) -> None:
    """TE's fp8 provider wraps no HF layer: with only it installed, TransformersModel must not train (in fp32)."""
    monkeypatch.setattr(twinkle_hf.plugin, "torchao_installed", lambda: False)
    with _registry(_TePlugin()), pytest.raises(MissingBackendError, match=r"pip install twinkle-hf\[fp8\]"):
        make_model(mixed_precision="fp8")


def test_fp8_is_refused_off_an_fp8_gpu_with_the_reason() -> None:
    pytest.importorskip("torchao")
    with _registry(), pytest.raises(PrecisionError, match=r"on 'cpu': FP8 training needs a CUDA GPU .*'bf16'"):
        make_model(mixed_precision="fp8")


def test_recipe_choice_is_checked() -> None:
    with pytest.raises(ValueError, match="fp8 recipe"):
        TorchaoFP8("delayed")


@pytest.mark.parametrize("recipe,granularity", [("tensorwise", "TENSORWISE"), ("rowwise", "AXISWISE")])
def test_the_decoder_linears_become_float8_and_the_head_stays(recipe, granularity) -> None:
    pytest.importorskip("torchao")
    from torchao.float8.float8_linear import Float8Linear

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_config("qwen2", vocab_size=2590), dtype=torch.float32)
    TorchaoFP8(recipe).prepare_model(model)
    swapped = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, Float8Linear)}
    assert swapped == set(LINEARS)
    assert type(model.lm_head) is torch.nn.Linear  # the head stays in bf16
    layer = model.model.layers[0].self_attn.q_proj
    assert layer.config.cast_config_input.scaling_granularity.name == granularity
    assert layer.weight.dtype == torch.float32  # fp32 master weights
    assert not fp8_eligible(torch.nn.Linear(64, 24), "model.layers.0.mlp.up_proj")  # 24: no FP8 GEMM shape


def test_a_training_step_runs_fp8_gemms_and_learns(monkeypatch) -> None:
    """The whole TransformersModel path with the provider allowed on the CPU (its autocast on the CPU too):
    every decoder linear runs FP8 GEMMs forward and backward, and the loss goes down."""
    pytest.importorskip("torchao")
    monkeypatch.setattr(TorchaoFP8, "unavailable_reason", lambda self, device_type: None)
    monkeypatch.setattr(TorchaoFP8, "autocast", lambda self: torch.autocast("cpu", dtype=torch.bfloat16))
    with _registry():
        model = make_model(seed=2, mixed_precision="fp8")
    model.set_optimizer("AdamW", lr=1e-2)
    batch = make_batch(3)
    losses = []
    with _Fp8Matmuls() as spy:
        losses.append(float(model.forward_backward(inputs=batch)))
    # 2 layers x 7 linears, each 3 GEMMs (output, input gradient, weight gradient)
    assert spy.fp8 == 2 * len(LINEARS) * 3
    for _ in range(4):
        model.clip_grad_and_step()
        losses.append(float(model.forward_backward(inputs=batch)))
    assert losses[-1] < losses[0]
