"""MultiLoraTransformersModel refuses bad input clearly and leaves every slot as it was."""

from __future__ import annotations

import pytest
from hf_testing import make_batch, tensor_hash
from ml_testing import lora, make_multi

from twinkle.checkpoint import CheckpointError


def _state(model):
    weights = {f"{n}.{s}": list(model.slots.pair(n, s)) for n in model.slots.layers for s in
               (t.adapter_name for t in model.multi_lora.tenants)}
    records = [(t.index, t.adapter_name, t.tenant_adapter_name, repr(t.tenant_config))
               for t in model.multi_lora.tenants]
    return tensor_hash(weights), records, sorted(model.optimizer_group), dict(model.slots.specs)


@pytest.fixture(scope="module")
def model():
    m = make_multi(max_loras=2, max_r=8, target_modules=["q_proj", "v_proj", "o_proj"], max_length=24)
    m.multi_lora.acquire_lora("a", lora(4, 8, ("q_proj",)))
    return m


@pytest.mark.parametrize("call, error, words", [
    (lambda m: m.multi_lora.acquire_lora("x", lora(16, 8)), RuntimeError, "max_r=8"),
    (lambda m: m.multi_lora.acquire_lora("a", lora(4, 8)), ValueError, "already holds slot 'lora_0'"),
    (lambda m: m.multi_lora.acquire_lora("x", lora(4, 8, ("up_proj",))), ValueError, "hold no slot"),
    (lambda m: m.multi_lora.acquire_lora("x", lora(4, 8, ("q_proj", "nope"))), ValueError, r"\['nope'\] do not exist"),
    (lambda m: m.multi_lora.acquire_lora("x", lora(4, 8, use_dora=True)), ValueError, "use_dora"),
    (lambda m: m.multi_lora.acquire_lora("x", lora(4, 8, init_lora_weights="gaussian")), ValueError,
     "init_lora_weights"),
    (lambda m: m.multi_lora.acquire_lora("x", {"r": 4}), ValueError, "integer rank"),
    (lambda m: m.multi_lora.release_lora("ghost"), KeyError, "No tenant named 'ghost'"),
    (lambda m: m.forward_backward(inputs=make_batch(1, length=30), adapter_name="a"), ValueError,
     "30 tokens per row .* max_length=24"),
    (lambda m: m.forward(inputs=make_batch(1), adapter_name="lora_1"), KeyError, "'lora_1' is free"),
    (lambda m: m.load_lora("x", "/nonexistent/adapter"), CheckpointError, "adapter_config.json"),
])
def test_bad_input_changes_nothing(model, call, error, words):
    before = _state(model)
    with pytest.raises(error, match=words):
        call(model)
    assert _state(model) == before


def test_more_tenants_than_slots(model):
    model.multi_lora.acquire_lora("b", lora(2, 2, ("v_proj",)))
    before = _state(model)
    with pytest.raises(RuntimeError, match="All 2 LoRA slots are taken"):
        model.multi_lora.acquire_lora("c", lora(2, 2, ("v_proj",)))
    assert _state(model) == before
    model.multi_lora.release_lora("b")


def test_a_mismatched_adapter_directory_is_refused(model, tmp_path):
    model.multi_lora.acquire_lora("wide", lora(8, 8, ("q_proj", "v_proj")))
    path = model.save("wide", str(tmp_path), adapter_name="wide")
    before = _state(model)
    with pytest.raises(CheckpointError, match="r=8 on 4 layers but the tenant has r=4 on 2 layers"):
        model.load(path, adapter_name="a")
    assert _state(model) == before
    model.multi_lora.release_lora("wide")


@pytest.mark.parametrize("kwargs, words", [(dict(max_loras=0), "max_loras"), (dict(max_r=0), "max_r"),
                                           (dict(max_length=0), "max_length"),
                                           (dict(target_modules=["nope"]), "do not exist")])
def test_bad_construction(kwargs, words):
    with pytest.raises(ValueError, match=words):
        make_multi(**kwargs)


def test_memory_efficient_init_on_one_process_is_the_plain_build():
    """Nothing to spare on one process: the flag builds the same model (torchrun: test_distributed.py)."""
    plain, efficient = make_multi(), make_multi(memory_efficient_init=True)
    assert efficient.memory_efficient_init
    assert tensor_hash(dict(efficient.model.state_dict())) == tensor_hash(dict(plain.model.state_dict()))
    assert tensor_hash(efficient.slots.initial) == tensor_hash(plain.slots.initial)
