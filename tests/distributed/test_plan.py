"""Strategy choice, decoder-layer discovery and config checks: plain functions, one process."""

from __future__ import annotations

import logging

import pytest
import torch
from scenarios import tiny_config

from twinkle import DeviceMesh
from twinkle_hf.distributed.layers import decoder_layer_classes
from twinkle_hf.distributed.plan import check_configs, make_plan


@pytest.mark.parametrize("strategy,sizes,world,kind,hsdp", [
    ("accelerate", {}, 1, "none", False),
    ("accelerate", {"dp_size": 2}, 2, "ddp", False),
    ("native_fsdp", {"dp_size": 4}, 4, "ddp", False),
    ("native_fsdp", {"fsdp_size": 2}, 2, "fsdp2", False),
    ("accelerate", {"fsdp_size": 2}, 2, "accelerate_fsdp2", False),
    ("native_fsdp", {"dp_size": 2, "fsdp_size": 2}, 4, "fsdp2", True),
    ("accelerate", {"dp_size": 2, "fsdp_size": 2}, 4, "fsdp2", True),
])
def test_the_mesh_and_strategy_choose_the_wrapping(strategy, sizes, world, kind, hsdp) -> None:
    plan = make_plan(strategy, DeviceMesh(**sizes), world_size=world)
    assert (plan.kind, plan.hsdp) == (kind, hsdp)


def test_accelerate_on_seed_001s_hsdp_mesh_runs_native_fsdp2_and_says_so(caplog) -> None:
    """``DeviceMesh.from_sizes(dp_size=2, fsdp_size=2)`` with the default strategy: HSDP, one info line."""
    with caplog.at_level(logging.INFO, logger="twinkle"):
        plan = make_plan("accelerate", DeviceMesh.from_sizes(dp_size=2, fsdp_size=2, world_size=4), world_size=4)
    assert (plan.kind, plan.hsdp, plan.dp_size, plan.fsdp_size) == ("fsdp2", True, 2, 2)
    assert caplog.text.count("HSDP (replicate x shard) runs on torch's native FSDP2") == 1


def test_sync_each_microbatch_is_twinkles_own_fsdp_option() -> None:
    for strategy in ("native_fsdp", "accelerate"):
        check_configs(strategy, None, {"sync_each_microbatch": False})
    with pytest.raises(ValueError, match=r"fsdp_config\['sync_each_microbatch'\] must be True .* or False .*got 'no'"):
        check_configs("native_fsdp", None, {"sync_each_microbatch": "no"})


def test_decoder_layers_come_from_the_live_model() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config("qwen2"))
    assert decoder_layer_classes(model) == ["Qwen2DecoderLayer"]

    class Qwen3_5MoeDecoderLayer(torch.nn.Module):  # the MoE name the title-case guess gets wrong
        pass

    model.model.layers.append(Qwen3_5MoeDecoderLayer())
    assert decoder_layer_classes(model) == ["Qwen2DecoderLayer", "Qwen3_5MoeDecoderLayer"]


def test_a_user_set_no_split_modules_wins_and_is_checked() -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config("qwen2"))
    model._no_split_modules = ["Qwen2MLP"]
    assert decoder_layer_classes(model) == ["Qwen2MLP"]
    model._no_split_modules = ["Qwen2_MoeDecoderLayer"]
    with pytest.raises(ValueError, match=r"names \['Qwen2_MoeDecoderLayer'\], which this model does not contain"):
        decoder_layer_classes(model)


def test_config_keys_are_checked_at_construction() -> None:
    from twinkle.model import TransformersModel

    check_configs("native_fsdp", {"bucket_cap_mb": 1, "static_graph": True}, {"reshard_after_forward": False})
    check_configs("accelerate", None, {"reshard_after_forward": False, "cpu_ram_efficient_loading": True})
    with pytest.raises(ValueError, match=r"ddp_config keys \['bucket_size'\] are not DistributedDataParallel"):
        TransformersModel(config=tiny_config("qwen2"), ddp_config={"bucket_size": 1})
    with pytest.raises(ValueError, match=r"fsdp_config keys \['shard_everything'\] are not understood by "
                                         r"strategy='native_fsdp'"):
        TransformersModel(config=tiny_config("qwen2"), strategy="native_fsdp", fsdp_config={"shard_everything": 1})


@pytest.fixture(scope="module")
def tiny_qwen2():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(tiny_config("qwen2"))


def _accelerate_policy(monkeypatch, model, mixed_precision: str, fsdp_config: dict | None = None):
    """The MixedPrecisionPolicy wrap_accelerate_fsdp2 hands to accelerate (the FSDP2 wrapping itself is not run)."""
    from accelerate.utils import fsdp_utils

    from twinkle_hf.distributed import wrap

    seen = {}
    monkeypatch.setattr(fsdp_utils, "fsdp2_prepare_model",
                        lambda accelerator, model: seen.setdefault("policy", accelerator.state.fsdp_plugin
                                                                   .mixed_precision_policy))
    monkeypatch.setattr(wrap, "check_sharded", lambda model, strategy: None)
    wrap.wrap_accelerate_fsdp2(model, model, torch.device("cpu"), mixed_precision, fsdp_config or {})
    return seen["policy"]


def test_accelerate_fsdp2_reduces_fp16_gradients_in_fp32_like_native_fsdp2(monkeypatch, tiny_qwen2) -> None:
    """Issue 22, defect 5: accelerate's own fp16 policy reduce-scatters in fp16 (loss-scaled sums overflow)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from twinkle_hf.distributed.wrap import mp_policy

    fp16 = _accelerate_policy(monkeypatch, tiny_qwen2, "fp16")
    assert (fp16.param_dtype, fp16.reduce_dtype) == (torch.float16, torch.float32)
    assert fp16.reduce_dtype == mp_policy("fp16", {}).reduce_dtype  # what strategy='native_fsdp' does
    # bf16 keeps accelerate's policy (bf16 has fp32's range; half the bytes)
    bf16 = _accelerate_policy(monkeypatch, tiny_qwen2, "bf16")
    assert (bf16.param_dtype, bf16.reduce_dtype) == (torch.bfloat16, torch.bfloat16)
    mine = MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=torch.float16)
    assert _accelerate_policy(monkeypatch, tiny_qwen2, "fp16", {"mixed_precision_policy": mine}) == mine  # user's
