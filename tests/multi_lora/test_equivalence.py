"""A tenant in an r-rank slice of a max_r slot behaves exactly like a plain peft model with its own config."""

from __future__ import annotations

import json

import pytest
import torch
from hf_testing import make_batch
from ml_testing import lora, make_multi, randomize, reference_base
from peft import PeftModel
from rounding import LORA_TERMS, tiny_hf, within
from safetensors.torch import load_file

from twinkle.loss import CrossEntropyLoss

CONFIGS = {
    "r4_qv": lora(4, 8, ("q_proj", "v_proj")),
    "r8_rslora_all": lora(8, 16, "all-linear", use_rslora=True),
    "r16_full_rank_mlp": lora(16, 4, ("gate_proj", "up_proj", "down_proj")),
    "r3_regex": lora(3, 6, r".*layers\.1\.self_attn\.(k|o)_proj"),
    "r4_all_but_excluded": lora(4, 8, "all-linear", exclude_modules=["model.layers.0.self_attn.q_proj", "o_proj"]),
}


def _peft_reference(model, tenant, tmp_path):
    path = model.save("ckpt", str(tmp_path), adapter_name=tenant)
    return PeftModel.from_pretrained(reference_base(model), path, is_trainable=True), path

#: A slice of a wider slot sums the same terms as peft in another order (padded widths, batched matmuls):
#: float32's bound for a forward (logits, loss) and a backward (gradients) of 4 rows of 12 tokens (rounding.py).
FWD = tiny_hf(12, 4, extra=LORA_TERMS).forward_bound()
STEP = tiny_hf(12, 4, extra=LORA_TERMS).step_bound()


@pytest.mark.parametrize("name", list(CONFIGS))
def test_output_and_saved_adapter_match_plain_peft(name, tmp_path):
    model = make_multi(max_r=16)
    model.multi_lora.acquire_lora("other", lora(16, 16, "all-linear"))  # a neighbour that must not leak in
    randomize(model, "other", seed=7)
    slot = model.multi_lora.acquire_lora("t", CONFIGS[name])
    randomize(model, "t", seed=1)
    ref, path = _peft_reference(model, "t", tmp_path)

    saved = load_file(f"{path}/adapter_model.safetensors")
    r = CONFIGS[name].r
    assert saved and all(v.shape[0 if ".lora_A." in k else 1] == r for k, v in saved.items())
    assert json.loads(open(f"{path}/adapter_config.json").read())["r"] == r
    assert len(saved) == 2 * len(model.slots.specs[slot].targets)
    peft_targets = {n.removeprefix("base_model.model.") for n, m in ref.named_modules()
                    if hasattr(m, "lora_A") and "default" in m.lora_A}
    assert model.slots.specs[slot].targets == peft_targets

    batch = make_batch(3)
    ref.eval()
    with torch.no_grad():
        expected = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    got = model.forward_only(inputs=batch, adapter_name="t").logits
    assert not torch.allclose(expected, reference_base(model)(input_ids=batch["input_ids"]).logits, atol=1e-3)
    torch.testing.assert_close(got, expected, **within(FWD, expected))


def test_gradients_are_those_of_an_r_rank_peft_adapter(tmp_path):
    model = make_multi(max_r=16)
    slot = model.multi_lora.acquire_lora("t", lora(4, 8, ("q_proj", "v_proj", "down_proj")))
    randomize(model, "t", seed=2)
    ref, _ = _peft_reference(model, "t", tmp_path)
    batch = make_batch(4)
    loss = model.forward_backward(inputs=batch, adapter_name="t")

    ref.train()
    out = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    total, items = CrossEntropyLoss().compute(batch, out)
    (total / items).backward()
    assert loss == pytest.approx(float((total / items).detach()), rel=FWD)
    for name in model.slots.layers:
        a, b = model.slots.pair(name, slot)
        if name not in model.slots.specs[slot].targets:
            assert a.grad is None and b.grad is None and not a.any() and not b.any()
            continue
        ref_layer = ref.get_submodule(f"base_model.model.{name}")
        want_a, want_b = ref_layer.lora_A["default"].weight.grad, ref_layer.lora_B["default"].weight.grad
        torch.testing.assert_close(a.grad[:4], want_a, **within(STEP, want_a))
        torch.testing.assert_close(b.grad[:, :4], want_b, **within(STEP, want_b))
        assert not a.grad[4:].any() and not b.grad[:, 4:].any()


def test_unused_ranks_stay_zero_through_training():
    model = make_multi(max_r=16)
    slot = model.multi_lora.acquire_lora("t", lora(4, 8, ("q_proj", "v_proj")))
    model.set_optimizer("AdamW", lr=0.05, weight_decay=0.1, adapter_name="t")
    for seed in range(3):
        model.forward_backward(inputs=make_batch(seed), adapter_name="t")
        model.clip_grad_and_step(adapter_name="t")
    for name in model.slots.specs[slot].targets:
        a, b = model.slots.pair(name, slot)
        assert a[:4].any() and b[:, :4].any()  # trained
        assert not a[4:].any() and not b[:, 4:].any()


def test_dropout_is_the_tenants_own(tmp_path):
    model = make_multi(max_r=8)
    model.multi_lora.acquire_lora("t", lora(4, 8, ("q_proj", "v_proj"), lora_dropout=0.5))
    model.multi_lora.acquire_lora("nodrop", lora(4, 8, ("q_proj", "v_proj")))
    randomize(model, "t", seed=3)
    ref, _ = _peft_reference(model, "t", tmp_path)
    ref.train()
    batch = make_batch(5)
    torch.manual_seed(11)
    got = model.forward(inputs=batch, adapter_name="t").logits.detach()
    torch.manual_seed(11)
    expected = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.detach()
    torch.testing.assert_close(got, expected, **within(FWD, expected))
    evaluated = model.forward_only(inputs=batch, adapter_name="t").logits
    assert not torch.allclose(got, evaluated, atol=1e-4)  # dropout really was on in training


def test_a_peft_directory_loads_into_a_slot(tmp_path):
    source = make_multi(max_r=8)
    source.multi_lora.acquire_lora("t", lora(4, 8, ("q_proj", "o_proj")))
    randomize(source, "t", seed=4)
    path = source.save("src", str(tmp_path), adapter_name="t")
    ref = PeftModel.from_pretrained(reference_base(source), path).eval()

    target = make_multi(max_r=8)
    target.multi_lora.acquire_lora("first", lora(8, 8, "all-linear"))
    name = target.load_lora("loaded", path)
    assert name == "lora_1" and target.multi_lora.get("loaded").tenant_config.r == 4
    batch = make_batch(6)
    with torch.no_grad():
        expected = ref(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(target.forward_only(inputs=batch, adapter_name="loaded").logits, expected,
                               **within(FWD, expected))
    # load() into an existing tenant with the same config works, a different r is refused untouched
    target.multi_lora.acquire_lora("same", lora(4, 8, ("q_proj", "o_proj")))
    target.load(path, adapter_name="same")
    # exact: the same file's tensors copied into two slots
    torch.testing.assert_close(target.get_state_dict(adapter_name="same"), target.get_state_dict(adapter_name="loaded"),
                               rtol=0, atol=0)


def test_bf16_autocast_tenant_tracks_the_fp32_one():
    losses, grads = [], []
    for precision in ("no", "bf16"):
        model = make_multi(max_r=8, mixed_precision=precision)
        slot = model.multi_lora.acquire_lora("t", lora(4, 8, ("q_proj", "v_proj")))
        randomize(model, "t", seed=8)
        losses.append(model.forward_backward(inputs=make_batch(9), adapter_name="t"))
        grads.append(torch.cat([p.grad.flatten() for p in model.slots.spec_parameters(model.slots.specs[slot])]))
        assert all(p.dtype == torch.float32 for p in model.slots.spec_parameters(model.slots.specs[slot]))
    # measured, kept: bf16 autocast against fp32 (a derived bf16 bound, ~6 sqrt(n) 2**-8 ~ 0.1, could not fail)
    assert losses[1] == pytest.approx(losses[0], rel=2e-2)
    assert torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0) > 0.99


def test_seeded_acquire_gives_the_same_init_in_any_slot_and_model():
    """acquire_lora(..., seed=) makes the init a function of (seed, config): peft's A bound, zero B."""
    first, second = make_multi(seed=0, max_r=16), make_multi(seed=1, max_loras=4, max_r=8)
    second.acquire_lora("filler", lora(r=2))  # the seeded tenant lands in another slot of another model
    assert first.acquire_lora("t", lora(r=4), seed=11) == "lora_0"
    assert second.acquire_lora("t", lora(r=4), seed=11) == "lora_1"
    first.acquire_lora("other_seed", lora(r=4), seed=12)
    a, b = first.get_state_dict(adapter_name="t"), second.get_state_dict(adapter_name="t")
    assert a.keys() == b.keys() and a
    for key in a:
        assert torch.equal(a[key], b[key]), key
        if "lora_B" in key:
            assert torch.count_nonzero(a[key]) == 0
        else:  # kaiming_uniform(a=sqrt(5)) on (r, in): |w| <= 1/sqrt(in)
            assert 0 < a[key].abs().max() <= a[key].shape[1] ** -0.5
    other = first.get_state_dict(adapter_name="other_seed")
    assert not any(torch.equal(a[k], other[k]) for k in a if "lora_A" in k)
    slot = first.slots.pair(next(n for n in first.slots.layers if n.endswith("q_proj")), "lora_0")[0]
    assert torch.count_nonzero(slot[:4]) > 0 and torch.count_nonzero(slot[4:]) == 0  # ranks beyond r stay zero
    first.release_lora("t")
    assert first.multi_lora.find("t") is None
