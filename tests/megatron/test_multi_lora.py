"""MultiLoraMegatronModel: tenant slots on megatron's LoRA layers against independent references.

References: peft's LoRA on the HF model (``PeftModel.from_pretrained`` of the tenant's saved
adapter) and a plain single-adapter MegatronModel loading the same directory; isolation is checked
by hashing every slot tensor.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from megatron_testing import hf_model, make_batch, megatron_model, save_hf
from peft import LoraConfig, PeftModel
from rounding import LORA_TERMS, U, tiny_hf, within

from twinkle.checkpoint import CheckpointError

QKVO = ["q_proj", "k_proj", "v_proj", "o_proj"]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return save_hf(hf_model("qwen2"), tmp_path_factory.mktemp("multi_lora") / "hf")


def _multi(base, **kwargs):
    from twinkle.model import MegatronModel, MultiLoraMegatronModel

    assert issubclass(MultiLoraMegatronModel, MegatronModel)

    kwargs.setdefault("max_loras", 3)
    kwargs.setdefault("max_r", 8)
    return MultiLoraMegatronModel(model_id=str(base), mixed_precision="no", **kwargs)


def _randomise(model, tenant, seed):
    """Give the tenant's used ranks non-trivial values (B starts at zero: a no-op adapter)."""
    gen = torch.Generator().manual_seed(seed)
    spec = model.slots.specs[model.multi_lora.get(tenant).adapter_name]
    with torch.no_grad():
        for name, layer in model.slots.layers().items():
            if name in spec.targets:
                b = layer.lora_B[spec.slot]
                b[:, :spec.r] = 0.1 * torch.randn(b[:, :spec.r].shape, generator=gen)


def _slot_hashes(model, slot):
    digest = {}
    for name, layer in model.slots.layers().items():
        for kind, tensor in (("A", layer.lora_A[slot]), ("B", layer.lora_B[slot])):
            digest[f"{name}.{kind}"] = hashlib.sha256(tensor.detach().numpy().tobytes()).hexdigest()
    return digest


def _hf_logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def test_tenant_matches_peft_and_a_single_adapter_model(base, tmp_path):
    model = _multi(base)
    model.multi_lora.acquire_lora("other", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    _randomise(model, "other", seed=7)  # a busy neighbour slot must not leak into the tenant's output
    name = model.multi_lora.acquire_lora("t", LoraConfig(r=3, lora_alpha=12, lora_dropout=0.1, use_rslora=True,
                                                          target_modules=QKVO))
    assert name == "lora_1"
    _randomise(model, "t", seed=1)
    batch = make_batch(seed=3)
    real = batch["attention_mask"].bool()
    ours = model.forward_only(inputs=batch, adapter_name="t")["logits"]
    assert torch.equal(ours, model.forward_only(inputs=batch, adapter_name=name)["logits"])  # slot name works too

    path = model.save("t", output_dir=str(tmp_path), adapter_name="t")
    config = json.loads((tmp_path / "t" / "adapter_config.json").read_text())
    assert config["r"] == 3 and config["use_rslora"] and sorted(config["target_modules"]) == sorted(QKVO)
    state = model.get_state_dict(adapter_name="t")
    assert state["base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight"].shape == (3, 64)
    assert not any("mlp" in k for k in state)

    peft_ref = PeftModel.from_pretrained(hf_model("qwen2"), path).eval()
    ref = _hf_logits(peft_ref, batch)[real]
    torch.testing.assert_close(ours[real], ref, **within(FWD, ref))
    assert (ours - _hf_logits(hf_model("qwen2"), batch))[real].abs().max() > 1e-3  # the adapter does something

    single = megatron_model(base)
    single.add_adapter_to_model("t", path)
    other = single.forward_only(inputs=batch)["logits"][real]
    torch.testing.assert_close(ours[real], other, **within(FWD, other))


def test_training_one_tenant_leaves_the_other_bit_identical_and_release_resets(base, tmp_path):
    model = _multi(base)
    initial = {slot.adapter_name: _slot_hashes(model, slot.adapter_name) for slot in model.multi_lora.tenants}
    a = model.multi_lora.acquire_lora("a", LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"))
    b = model.multi_lora.acquire_lora("b", LoraConfig(r=2, lora_alpha=4, target_modules=["o_proj", "down_proj"]))
    model.set_optimizer("default", lr=2e-2, weight_decay=0.1, adapter_name="a")
    model.set_optimizer("default", lr=2e-2, adapter_name="b")
    model.forward_backward(inputs=make_batch(seed=9), adapter_name="b")
    model.clip_grad_and_step(1.0, adapter_name="b")
    b_before, b_group = _slot_hashes(model, b), model.optimizer_group[b]
    b_progress = b_group.progress(0)
    batch = make_batch(seed=5)
    losses = []
    with model.multi_lora.adapter("a"):
        for _ in range(5):
            losses.append(model.forward_backward(inputs=batch))
            model.clip_grad_and_step(1.0)
    assert losses[-1] < losses[0] - 0.05
    assert _slot_hashes(model, b) == b_before and b_group.progress(0) == b_progress
    spec = model.slots.specs[a]
    for layer in model.slots.layers().values():  # ranks >= r stay zero after AdamW with weight decay
        assert not layer.lora_A[a][spec.r:].any() and not layer.lora_B[a][:, spec.r:].any()

    saved = model.save("a", output_dir=str(tmp_path), adapter_name="a")
    model.multi_lora.release_lora("a")
    assert _slot_hashes(model, a) == initial[a] and a not in model.optimizer_group
    assert model.multi_lora.names() == ["b"] and _slot_hashes(model, b) == b_before
    with pytest.raises(KeyError, match="No tenant named 'a'"):
        model.forward_only(inputs=batch, adapter_name="a")
    assert model.load_lora("a2", saved) == a  # the freed slot, with the trained weights back
    trained = model.forward_backward(inputs=batch, adapter_name="a2")
    assert trained == model.forward_backward(inputs=batch, adapter_name="a2")  # exact: same weights, same ops
    assert trained < losses[0] - 0.05

    def step_b() -> dict[str, str]:
        model.forward_backward(inputs=batch, adapter_name="b")
        model.clip_grad_and_step(1.0, adapter_name="b")
        return _slot_hashes(model, b)

    checkpoint = model.save("b-ckpt", output_dir=str(tmp_path), adapter_name="b", save_optimizer=True)
    after_one = step_b()
    model.resume_from_checkpoint(checkpoint, adapter_name="b")  # weights, AdamW state and progress back
    assert _slot_hashes(model, b) == b_before and step_b() == after_one


def test_bad_inputs_are_refused_and_leave_the_slots_unchanged(base, tmp_path):
    model = _multi(base, max_loras=2, max_r=4, max_length=10, target_modules=["o_proj", "down_proj"])
    model.multi_lora.acquire_lora("a", LoraConfig(r=4, target_modules=["o_proj"]))
    model.multi_lora.acquire_lora("b", LoraConfig(r=1, target_modules=["down_proj"]))
    before = {slot.adapter_name: _slot_hashes(model, slot.adapter_name) for slot in model.multi_lora.tenants}
    with pytest.raises(RuntimeError, match="r=5 but the slots have max_r=4"):
        model.multi_lora.acquire_lora("x", LoraConfig(r=5, target_modules=["o_proj"]))
    with pytest.raises(ValueError, match="already holds slot 'lora_0'"):
        model.multi_lora.acquire_lora("a", LoraConfig(r=2, target_modules=["o_proj"]))
    with pytest.raises(ValueError, match="modules the slots do not cover"):
        model.multi_lora.acquire_lora("x", LoraConfig(r=2, target_modules=QKVO))
    with pytest.raises(ValueError, match=r"use_dora=True\) is not supported"):
        model.multi_lora.acquire_lora("x", LoraConfig(r=2, target_modules=["o_proj"], use_dora=True))
    with pytest.raises(RuntimeError, match="All 2 LoRA slots are taken"):
        model.multi_lora.acquire_lora("c", LoraConfig(r=1, target_modules=["o_proj"]))
    with pytest.raises(KeyError, match="No tenant named 'nobody'"):
        model.multi_lora.release_lora("nobody")
    with pytest.raises(ValueError, match="pass adapter_name=<tenant>"):
        model.forward_only(inputs=make_batch(seed=1, length=8))
    with pytest.raises(ValueError, match="12 tokens per row .* max_length=10"):
        model.forward_only(inputs=make_batch(seed=1, length=12), adapter_name="a")
    with pytest.raises(TypeError, match="acquire_lora"):
        model.add_adapter_to_model("x", LoraConfig(r=2, target_modules=["o_proj"]))
    model.save("b", output_dir=str(tmp_path), adapter_name="b")
    with pytest.raises(CheckpointError, match="does not fit tenant slot 'lora_0'"):
        model.load(str(tmp_path / "b"), adapter_name="a")
    assert model.multi_lora.names() == ["a", "b"]
    assert {s.adapter_name: _slot_hashes(model, s.adapter_name) for s in model.multi_lora.tenants} == before
    with pytest.raises(ValueError, match="max_r must be an integer >= 1"):
        _multi(base, max_r=0)


# ------------------------------------------------------------------ the MultiTenantModel protocol
TENANTS = {"a": LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"),
           "b": LoraConfig(r=8, lora_alpha=16, use_rslora=True, target_modules=QKVO),
           "c": LoraConfig(r=2, lora_alpha=2, target_modules=["down_proj"])}
# each tenant's micro-batches: different row counts and lengths, so the stacked path pads differently
BATCHES = {"a": [dict(seed=61, rows=2, length=10), dict(seed=62, rows=3, length=7)],
           "b": [dict(seed=63, rows=4, length=12), dict(seed=64, rows=1, length=12)],
           "c": [dict(seed=65, rows=1, length=6), dict(seed=66, rows=2, length=9)]}
# float32: the stacked forward runs wider (padded) matmuls, so sums are reordered: a forward's bound (losses) and
# a step's (gradients, norms) for at most 5 rows of 12 tokens per tenant and step (tests/rounding.py)
FWD = tiny_hf(12, 5, vocab=125, extra=LORA_TERMS).forward_bound()
STEP = tiny_hf(12, 5, vocab=125, extra=LORA_TERMS).step_bound()


def _close(a, b):
    torch.testing.assert_close(a, b, **within(STEP, b))


def _tenants(base, accumulation=1, tenants=TENANTS, optimizer=None, **kwargs):
    model = _multi(base, **kwargs)
    for i, (tenant, config) in enumerate(tenants.items()):
        model.acquire_lora(tenant, config)
        _randomise(model, tenant, seed=20 + i)
        model.set_optimizer("default", lr=1e-2, weight_decay=0.1, adapter_name=tenant, **(optimizer or {}))
        model._group(tenant).gradient_accumulation_steps = accumulation
    return model


def _grads(model, tenant):
    return [p.grad.clone() for _, p in model.backend.adapters.named_parameters(model._group(tenant))]


def test_forward_backward_multi_equals_each_tenants_forward_backward(base):
    from twinkle.model.multi_tenant import MultiTenantModel

    sgd = {"optimizer": {"optimizer": "sgd"}}  # stepped weights follow the gradients' bound (see below)
    fused, sequential = _tenants(base, accumulation=2, **sgd), _tenants(base, accumulation=2, **sgd)
    assert isinstance(fused, MultiTenantModel) and fused.tenants() == list(TENANTS)
    _stacked_equals_alone(fused, sequential, BATCHES)


def _stacked_equals_alone(fused, sequential, batches_of):
    """``forward_backward_multi`` of every tenant's micro-batches = each tenant's ``forward_backward``: losses,
    gradients, norms, stepped weights, metrics."""
    tenants = list(batches_of)
    for micro in range(len(batches_of[tenants[0]])):
        batches = {t: make_batch(**batches_of[t][micro]) for t in tenants}
        got = {t: float(loss) for t, loss in fused.forward_backward_multi(batches).items()}
        assert got == pytest.approx({t: float(sequential.forward_backward(b, adapter_name=t))
                                     for t, b in batches.items()}, rel=FWD)
    pairs = [(t, a, b) for t in tenants for a, b in zip(_grads(fused, t), _grads(sequential, t), strict=True)]
    assert all(b.abs().sum() > 0 for _, _, b in pairs)
    for _, a, b in pairs:
        _close(a, b)
    for tenant in tenants:
        fused_norm, norm = (m.clip_grad_norm(1.0, adapter_name=tenant) for m in (fused, sequential))
        assert fused_norm == pytest.approx(norm, rel=STEP)
        fused.clip_grad_and_step(adapter_name=tenant)
        sequential.clip_grad_and_step(adapter_name=tenant)
        # SGD at lr 1e-2: a weight moves by lr * g, g within _close's bound of at most (1 + sqrt(128)) STEP of the
        # largest gradient, itself at most the clipped norm 1; the stored weights one ulp (2 u |w|) apart. (Adam's
        # eps = 1e-8 would turn that rounding of a near-zero gradient into an update of up to lr.)
        torch.testing.assert_close(fused.get_state_dict(adapter_name=tenant),
                                   sequential.get_state_dict(adapter_name=tenant), rtol=2 * U,
                                   atol=1e-2 * STEP * (1 + 128**0.5))
        fused_metrics, metrics = (m.calculate_metric(True, adapter_name=tenant) for m in (fused, sequential))
        assert fused_metrics["loss"] == pytest.approx(metrics["loss"], rel=FWD)
        assert (fused_metrics["token_accuracy"], fused_metrics["step"]) == (metrics["token_accuracy"], 1)


def test_a_tenants_rows_do_not_leak_into_another_tenants_gradient(base):
    grads = []
    for other_seed in (70, 71):
        model = _tenants(base)
        model.forward_backward_multi({"a": make_batch(seed=72, rows=2), "b": make_batch(seed=other_seed, rows=3)})
        grads.append(_grads(model, "a"))
        assert all(p.grad is None for _, p in model.backend.adapters.named_parameters(model._group("c")))
    for g0, g1 in zip(*grads, strict=True):
        _close(g0, g1)


def test_seeded_acquire_load_and_release_through_the_model(base, tmp_path):
    """acquire_lora(seed=) gives a MegatronModel adapter's init of the same config, in whichever slot."""
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear")
    single = megatron_model(base)
    single.add_adapter_to_model("a", config)  # the first adapter is drawn with seed 0
    model = _multi(base)
    model.acquire_lora("first", LoraConfig(r=2, target_modules=QKVO), seed=5)
    assert model.acquire_lora("seeded", config, seed=0) == "lora_1"
    reference = single.get_state_dict(adapter_name="a")
    state = model.get_state_dict(adapter_name="seeded")
    assert state.keys() == reference.keys() and all(torch.equal(state[k], reference[k]) for k in reference)

    _randomise(model, "seeded", seed=3)
    trained = model.get_state_dict(adapter_name="seeded")
    saved = model.save("seeded", output_dir=str(tmp_path), adapter_name="seeded")
    model.release_lora("seeded")
    assert model.tenants() == ["first"]
    assert model.load_lora("again", saved) == "lora_1"
    assert model.tenants() == ["first", "again"]
    again = model.get_state_dict(adapter_name="again")
    assert again.keys() == trained.keys() and all(torch.equal(again[k], v) for k, v in trained.items())
    with pytest.raises(CheckpointError):
        model.load_lora("broken", tmp_path / "nowhere")
    assert model.tenants() == ["first", "again"]


def _rollouts(seed):
    from twinkle.rollout import Rollout

    gen = torch.Generator().manual_seed(seed)
    return [Rollout(torch.randint(3, 120, (p,), generator=gen).tolist(),
                    torch.randint(3, 120, (c,), generator=gen).tolist(), (-torch.rand(c, generator=gen) * 4).tolist(),
                    float(torch.randn(1, generator=gen))) for p, c in ((3, 4), (2, 6), (5, 2))]


def test_grpo_with_a_kl_penalty_takes_the_shared_base_as_reference(base):
    """The KL term's reference is the base model without any tenant's LoRA, in one tenant's step and in the
    stacked step of several (where the other rows still run through their own slots)."""
    rollouts = {"a": _rollouts(1), "b": _rollouts(2)}

    def tenants(beta):
        model = _tenants(base)
        for tenant in rollouts:
            model.set_loss("grpo", beta=beta, adapter_name=tenant)
        return model

    fused, alone, without_kl = tenants(0.1), tenants(0.1), tenants(0.0)
    got = {t: float(v) for t, v in fused.forward_backward_multi(rollouts).items()}
    want = {t: float(alone.forward_backward(r, adapter_name=t)) for t, r in rollouts.items()}
    assert got == pytest.approx(want, rel=FWD)
    for tenant in rollouts:
        for a, b in zip(_grads(fused, tenant), _grads(alone, tenant), strict=True):
            _close(a, b)
        # the tenants' LoRA moves the policy away from the base: a positive KL on top of the same surrogate
        assert want[tenant] > float(without_kl.forward_backward(rollouts[tenant], adapter_name=tenant)) + 1e-4


# ------------------------------------------------------------------ slots on lm_head (tied, like the service's model)
HEAD_TARGETS = [*QKVO, "gate_proj", "up_proj", "down_proj", "lm_head"]
HEAD_TENANTS = {"h": LoraConfig(r=4, lora_alpha=8, target_modules=HEAD_TARGETS),
                "n": LoraConfig(r=2, lora_alpha=4, target_modules=QKVO),  # leaves lm_head out
                "o": LoraConfig(r=3, lora_alpha=6, use_rslora=True, target_modules=["lm_head"])}
HEAD_BATCHES = {"h": [dict(seed=81, rows=2, length=10)], "n": [dict(seed=82, rows=3, length=7)],
                "o": [dict(seed=83, rows=1, length=12)]}


@pytest.fixture(scope="module")
def tied_base(tmp_path_factory):
    return save_hf(hf_model("qwen2", tie_word_embeddings=True), tmp_path_factory.mktemp("multi_lora_tied") / "hf")


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True` and a tied layer:UserWarning")
def test_slots_on_lm_head_give_pefts_logits_and_the_stacked_step_of_each_tenant(tied_base, tmp_path):
    # SGD: gradients agree to ~1e-7 (summation order); Adam's first step g/(|g|+eps) would magnify that noise on
    # clipped near-zero entries beyond the weight tolerance, which is about Adam, not about the stacked step
    options = dict(tenants=HEAD_TENANTS, target_modules=HEAD_TARGETS, optimizer={"optimizer": "sgd"})
    fused = _tenants(tied_base, **options)
    head = fused.gpt.output_layer
    slot_n = fused.multi_lora.get("n").adapter_name
    assert not head.lora_A[slot_n].any() and not head.lora_B[slot_n].any()  # untargeted: zero, and never routed
    batch = make_batch(seed=3)
    real = batch["attention_mask"].bool()
    base_logits = _hf_logits(hf_model("qwen2", tie_word_embeddings=True), batch)
    for tenant in HEAD_TENANTS:
        path = fused.save(tenant, output_dir=str(tmp_path), adapter_name=tenant)
        config = json.loads((tmp_path / tenant / "adapter_config.json").read_text())
        assert ("lm_head" in config["target_modules"]) == (tenant != "n")
        ours = fused.forward_only(inputs=batch, adapter_name=tenant)["logits"]
        ref = _hf_logits(PeftModel.from_pretrained(hf_model("qwen2", tie_word_embeddings=True), path).eval(), batch)
        torch.testing.assert_close(ours[real], ref[real], **within(FWD, ref[real]))
        assert (ref - base_logits)[real].abs().max() > 1e-3
    sequential = _tenants(tied_base, **options)
    _stacked_equals_alone(fused, sequential, HEAD_BATCHES)
    assert not head.lora_B[slot_n].any()  # the tenant without lm_head still has nothing there after its step
