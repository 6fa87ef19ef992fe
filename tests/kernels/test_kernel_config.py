"""DEFAULT_KERNEL_CONFIG: assembled lazily from the registry, npu before liger before torch."""

from __future__ import annotations

import json
import subprocess
import sys
import types
import warnings

import pytest
from rounding import chain_bound

from twinkle.kernel import (
    DEFAULT_KERNEL_CONFIG,
    KernelChoice,
    build_default_config,
    chain_for,
    kernel_function,
    normalize_config,
)
from twinkle.plugins import Provenance, TwinklePluginWarning, create_plugin_manager
from twinkle.registry import Registry, set_registry

HEAVY = ("torch", "torch_npu", "liger_kernel", "transformers", "triton")


def test_importing_and_building_the_default_config_imports_nothing_heavy():
    code = (
        "import sys, json, twinkle, twinkle.kernel as k\n"
        "before = sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:]))\n"
        "chains = {op: [c.name for c in chain] for op, chain in k.DEFAULT_KERNEL_CONFIG.items()}\n"
        "after = sorted({m.split('.')[0] for m in sys.modules} & set(sys.argv[1:]))\n"
        "print(json.dumps({'before': before, 'after': after, 'chains': chains}))"
    )
    proc = subprocess.run([sys.executable, "-c", code, *HEAVY], capture_output=True, text=True, check=True)
    out = json.loads(proc.stdout)
    assert out["before"] == [] and out["after"] == []
    assert out["chains"]["rms_norm"] == ["npu.rms_norm", "liger.rms_norm", "torch.rms_norm"]
    assert out["chains"]["attention"] == ["npu.attention", "torch.attention"]
    assert out["chains"]["fused_linear_cross_entropy"] == ["liger.fused_linear_cross_entropy",
                                                           "torch.fused_linear_cross_entropy"]


def _plugin(specs):
    class Plugin:
        from twinkle.hookspecs import hookimpl

        @hookimpl
        def register_kernels(self):
            return specs

    return Plugin()


def test_chains_are_ordered_by_priority_not_registration_and_bad_entries_are_skipped():
    specs = {  # registered torch-last-first on purpose; one entry is not a KernelChoice
        "mine.rms_norm_torch_like": "twinkle.kernel.torch_choices:TORCH_RMS_NORM",
        "liger.rms_norm": "twinkle_hf.kernels.liger_choices:LIGER_RMS_NORM",
        "npu.rms_norm": "twinkle_npu.kernels.choices:NPU_RMS_NORM",
        "not_a_choice": "twinkle.kernel.probes:rotate_half",
    }
    registry = Registry(create_plugin_manager(entry_points=False,
                                              extra=[(_plugin(specs), Provenance("p", "dist-p", "1.0"))]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chains = build_default_config(registry)
    assert [c.name for c in chains["rms_norm"]] == ["npu.rms_norm", "liger.rms_norm", "torch.rms_norm",
                                                    "torch.rms_norm"]
    assert any(issubclass(w.category, TwinklePluginWarning) and "not_a_choice" in str(w.message) for w in caught)


def test_default_config_follows_the_process_registry(monkeypatch):
    custom = KernelChoice("custom", "swiglu", devices=("cpu",), priority=1000)
    holder = types.ModuleType("kernel_choice_holder")
    holder.CUSTOM = custom
    monkeypatch.setitem(sys.modules, "kernel_choice_holder", holder)
    mine = Registry(create_plugin_manager(entry_points=False, extra=[
        (_plugin({"custom.swiglu": "kernel_choice_holder:CUSTOM"}), Provenance("p", "dist-p", "1.0"))]))
    old = set_registry(mine)
    try:
        assert chain_for("mlp")[0] is custom
        assert [c.name for c in DEFAULT_KERNEL_CONFIG["swiglu"]] == ["custom.swiglu", "torch.swiglu"]
    finally:
        set_registry(old)
    assert chain_for("swiglu")[0].name == "npu.swiglu"


def test_kernel_function_gives_the_first_available_function():
    import torch
    import torch.nn.functional as F

    from twinkle.kernel.fused_linear_ce import fused_linear_cross_entropy

    assert kernel_function("fused_linear_cross_entropy", "cpu") is fused_linear_cross_entropy
    ce = kernel_function("cross_entropy", "cuda")  # liger has no plain CE choice: torch on every device
    logits, labels = torch.randn(6, 11), torch.tensor([1, 2, -100, 4, 5, 10])
    out = ce(logits, labels, reduction="sum")
    # another order of a log-sum-exp over 11 logits and a sum over 5 tokens (tests/rounding.py)
    torch.testing.assert_close(out.loss, F.cross_entropy(logits, labels, reduction="sum"), rtol=chain_bound(11, 5),
                               atol=0)
    assert int(out.num_tokens) == 5
    with pytest.raises(LookupError, match="swiglu"):
        kernel_function("swiglu", "cpu")


def test_custom_mapping_takes_names_aliases_and_a_default_based_override():
    config = normalize_config({"rope": "liger.rotary_embedding", "rms_norm": ["liger.rms_norm", "torch.rms_norm"]})
    assert [c.name for c in config["rotary_embedding"]] == ["liger.rotary_embedding"]
    merged = normalize_config({**DEFAULT_KERNEL_CONFIG, "rms_norm": config["rms_norm"]})
    assert [c.name for c in merged["rms_norm"]] == ["liger.rms_norm", "torch.rms_norm"]
    assert merged["swiglu"] == DEFAULT_KERNEL_CONFIG["swiglu"]
