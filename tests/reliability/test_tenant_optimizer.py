"""Issue 13 item 7: an optimizer instance holding parameters outside its group is refused (one tenant, one set)."""

from __future__ import annotations

import pytest
import torch
from hf_testing import make_batch, model_state_hash, tiny_config
from hostile_testing import lora_model
from peft import LoraConfig


def test_adapter_optimizer_over_another_adapters_parameters_is_refused() -> None:
    model = lora_model(adapters=("a", "b"))
    b_params = model.backend.parameters(model.optimizer_group["b"])
    before = model_state_hash(model)
    with pytest.raises(ValueError, match=r"holds \d+ parameters? that group 'a' does not train.*b"):
        model.set_optimizer(torch.optim.AdamW(b_params, lr=1e-2), adapter_name="a")
    assert model_state_hash(model) == before
    mixed = model.backend.parameters(model.optimizer_group["a"]) + b_params[:1]
    with pytest.raises(ValueError, match="does not train"):
        model.set_optimizer(torch.optim.SGD(mixed, lr=1e-2), adapter_name="a")
    own = model.backend.parameters(model.optimizer_group["a"])
    model.set_optimizer(torch.optim.SGD(own, lr=1e-2), adapter_name="a")  # its own parameters: accepted
    assert model.optimizer_group["a"].optimizer.param_groups[0]["params"][0] is own[0]


def test_full_model_group_refuses_parameters_of_another_model() -> None:
    from hf_testing import make_model

    model, other = make_model(seed=1), make_model(seed=2)
    with pytest.raises(ValueError, match="does not train"):
        model.set_optimizer(torch.optim.AdamW(other.model.parameters(), lr=1e-3))


def test_tenant_optimizer_over_another_tenants_slot_is_refused_and_b_stays_put() -> None:
    from twinkle.model import MultiLoraTransformersModel

    torch.manual_seed(0)
    model = MultiLoraTransformersModel(config=tiny_config(), mixed_precision="no", max_loras=2, max_r=4,
                                       target_modules=["q_proj", "v_proj"])
    for tenant in ("a", "b"):
        model.multi_lora.acquire_lora(tenant, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        model.set_optimizer("AdamW", lr=1e-2, adapter_name=tenant)
    b_state = {k: v.clone() for k, v in model.get_state_dict(adapter_name="b").items()}
    b_params = model.backend.parameters(model._group("b"))
    with pytest.raises(ValueError, match=r"does not train"):
        model.set_optimizer(torch.optim.SGD(b_params, lr=1.0), adapter_name="a")
    model.forward_backward(inputs=make_batch(0), adapter_name="a")
    model.clip_grad_and_step(adapter_name="a")
    after = model.get_state_dict(adapter_name="b")
    assert all(torch.equal(after[k], v) for k, v in b_state.items())  # a's step never touches b
