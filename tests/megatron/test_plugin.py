"""twinkle-megatron's registrations: lazy, complete, and safe with a broken Transformer Engine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from twinkle.errors import MissingBackendError
from twinkle.registry import get_registry, resolve
from twinkle_megatron import plugin, te
from twinkle_megatron.errors import MegatronConfigError


def test_components_resolve_through_the_registry():
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler as Megatron

    from twinkle_megatron.model import MegatronModel
    from twinkle_megatron.optim import MegatronDistributedOptimizer, OptimizerParamScheduler

    assert resolve("model", "MegatronModel") is MegatronModel
    assert resolve("optimizer", "MegatronDistributedOptimizer") is MegatronDistributedOptimizer
    assert resolve("lr_scheduler", "OptimizerParamScheduler") is OptimizerParamScheduler
    assert issubclass(OptimizerParamScheduler, Megatron)
    rows = {(c.kind, c.name): c.distribution for c in get_registry().components()}
    assert rows[("model", "MultiLoraMegatronModel")] == "twinkle-megatron"


def test_listing_and_importing_the_plugin_import_no_megatron_or_torch():
    code = ("import sys, json, twinkle_megatron.plugin, twinkle.registry\n"
            "twinkle.registry.list_components()\n"
            "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'megatron', 'torch', "
            "'transformer_engine', 'transformers'})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_without_transformer_engine_fp8_is_not_registered_and_names_the_extra():
    assert not te.te_installed() and plugin.register_precisions() == {}
    with pytest.raises(MissingBackendError, match=r"pip install twinkle-megatron\[fp8\]"):
        resolve("precision", "fp8")


def test_a_broken_transformer_engine_is_caught_not_raised(tmp_path, monkeypatch):
    """The bare transformer-engine meta package raises RuntimeError on import; it must not break twinkle."""
    for name in ("transformer_engine", "transformer_engine_torch"):
        (tmp_path / name).mkdir()
    (tmp_path / "transformer_engine" / "__init__.py").write_text("raise RuntimeError('no torch extension built')\n")
    (tmp_path / "transformer_engine_torch" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    te.import_te.cache_clear()
    try:
        assert te.te_installed()
        assert plugin.register_precisions() == {"fp8": "twinkle_megatron.fp8:TransformerEngineFP8"}
        module, why = te.import_te()
        assert module is None and "RuntimeError: no torch extension built" in why
        from twinkle_megatron.fp8 import TransformerEngineFP8

        assert TransformerEngineFP8().is_available("cuda") is False
        with pytest.raises(RuntimeError, match="fp8 autocast needs Transformer Engine"):
            TransformerEngineFP8().autocast()
    finally:
        te.import_te.cache_clear()
        sys.modules.pop("transformer_engine", None)


def test_fp8_on_cpu_is_refused_before_anything_is_built(tmp_path):
    from megatron_testing import hf_model, megatron_model, save_hf

    with pytest.raises(MissingBackendError, match=r"twinkle-megatron\[fp8\]"):
        megatron_model(save_hf(hf_model("qwen2"), tmp_path), mixed_precision="fp8")
    with pytest.raises(MegatronConfigError, match=r"mixed_precision='fp4' is not one of no, bf16, fp16, fp8"):
        megatron_model(tmp_path, mixed_precision="fp4")


FUSIONS = ("bias_dropout_fusion", "apply_rope_fusion", "gradient_accumulation_fusion", "masked_softmax_fusion",
           "persist_layer_norm")


@pytest.mark.parametrize("device_type,use_te,fused", [
    ("cpu", False, set()), ("cpu", True, set()), ("cuda", False, {"bias_dropout_fusion"}),
    ("cuda", True, {"bias_dropout_fusion", "apply_rope_fusion", "gradient_accumulation_fusion",
                    "masked_softmax_fusion"})])
def test_fusions_are_on_where_the_device_has_them(device_type, use_te, fused):
    from twinkle_megatron.build import fusions

    assert {n for n, on in fusions(device_type, use_te).items() if on} == fused
    assert set(fusions(device_type, use_te)) == set(FUSIONS)


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_the_transformer_config_takes_the_fusions_and_a_models_kwargs_override_them(device_type):
    from megatron_testing import tiny_config

    from twinkle_megatron.bridge.config import model_args
    from twinkle_megatron.build import fusions, transformer_config
    from twinkle_megatron.parallel.mesh import ParallelSizes

    args = model_args(tiny_config("qwen2"))
    config = transformer_config(args, ParallelSizes(), "bf16", device_type, False, {}, init_weights=False)
    assert {n: getattr(config, n) for n in FUSIONS} == fusions(device_type, False)
    off = transformer_config(args, ParallelSizes(), "bf16", device_type, False, {"bias_dropout_fusion": False},
                             init_weights=False)
    assert not off.bias_dropout_fusion
