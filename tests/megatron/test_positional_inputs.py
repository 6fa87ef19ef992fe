"""Seed 001 calls ``model.forward(inputs)``: MegatronModel and MultiLoraMegatronModel take ``inputs``
positionally as the HF backend does, and a positional call is the very same call as ``inputs=``."""

from __future__ import annotations

import inspect

import pytest
import torch
from megatron_testing import hf_model, make_batch, megatron_model, save_hf
from peft import LoraConfig


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_hf(hf_model("qwen2"), tmp_path_factory.mktemp("positional") / "hf")


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.gpt.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("cls_name", ["MegatronModel", "MultiLoraMegatronModel"])
def test_inputs_is_the_first_positional_parameter(cls_name):
    import twinkle.model

    cls = getattr(twinkle.model, cls_name)
    for name in ("forward", "forward_only", "forward_backward"):
        params = list(inspect.signature(getattr(cls, name)).parameters.values())
        assert params[1].name == "inputs" and params[1].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, name


def test_megatron_model_positional_calls_equal_keyword_calls(base):
    batch = make_batch(seed=4)
    keyword, positional = megatron_model(base), megatron_model(base)
    for model in (keyword, positional):
        model.add_adapter_to_model("a", LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
        with torch.no_grad():
            for name, param in model.gpt.named_parameters():
                if "lora_B" in name:  # B starts at zero: give the adapter an effect (same values in both)
                    param.copy_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))))
    torch.testing.assert_close(positional.forward_only(batch)["logits"],
                               keyword.forward_only(inputs=batch)["logits"], rtol=0, atol=0)
    positional.forward(batch)
    keyword.forward(inputs=batch)
    assert float(positional.calculate_loss()) == float(keyword.calculate_loss())

    loss_p, loss_k = positional.forward_backward(batch), keyword.forward_backward(inputs=batch)
    assert float(loss_p) == float(loss_k)
    grads_p, grads_k = _grads(positional), _grads(keyword)
    assert grads_p and grads_p.keys() == grads_k.keys()
    for name in grads_k:
        torch.testing.assert_close(grads_p[name], grads_k[name], rtol=0, atol=0, msg=name)


def test_multi_lora_megatron_positional_calls_equal_keyword_calls(base):
    from twinkle.model import MultiLoraMegatronModel

    model = MultiLoraMegatronModel(model_id=str(base), mixed_precision="no", max_loras=2, max_r=8)
    model.multi_lora.acquire_lora("tenant_a", LoraConfig(r=8, lora_alpha=16))  # seed 001: no target_modules
    batch = make_batch(seed=6)
    with model.multi_lora.adapter("tenant_a"):
        keyword = model.forward_only(inputs=batch)["logits"]
        positional = model.forward_only(batch)["logits"]
        torch.testing.assert_close(positional, keyword, rtol=0, atol=0)
        first = model.forward_backward(batch)
        grads = _grads(model)
        model.zero_grad()
        for param in model.gpt.parameters():
            param.grad = None
        second = model.forward_backward(inputs=batch)
    assert grads and float(first) == float(second)
    for name, grad in _grads(model).items():
        torch.testing.assert_close(grad, grads[name], rtol=0, atol=0, msg=name)
