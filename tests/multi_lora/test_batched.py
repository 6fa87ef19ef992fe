"""forward_backward_multi: one pass over rows of several tenants equals each tenant's own forward_backward."""

from __future__ import annotations

import pytest
import torch
from hf_testing import make_batch
from ml_testing import lora, make_multi, randomize, tenant_hash
from rounding import LORA_TERMS, U, tiny_hf, within
from torch.utils._python_dispatch import TorchDispatchMode

TENANTS = {"a": lora(4, 8, ("q_proj", "v_proj")), "b": lora(8, 16, "all-linear", use_rslora=True),
           "c": lora(2, 2, ("down_proj",))}
# each tenant's micro-batches: different row counts and lengths, so padding differs between the paths
BATCHES = {"a": [dict(seed=1, rows=2, length=10), dict(seed=2, rows=3, length=7)],
           "b": [dict(seed=3, rows=4, length=12), dict(seed=4, rows=1, length=12)],
           "c": [dict(seed=5, rows=1, length=6), dict(seed=6, rows=2, length=9)]}
# float32 tolerance: the fused path runs wider (padded) matmuls, so sums are reordered: the bound of a forward (losses)
# and of a backward (gradients, norms) of at most 5 rows of 12 tokens per tenant and step (tests/rounding.py)
FWD = tiny_hf(12, 5, extra=LORA_TERMS).forward_bound()
STEP = tiny_hf(12, 5, extra=LORA_TERMS).step_bound()


def _close(got, want):
    torch.testing.assert_close(got, want, **within(STEP, want))


def _model(optimizer: str = "AdamW"):
    model = make_multi(max_loras=3, max_r=8)
    for i, (tenant, config) in enumerate(TENANTS.items()):
        model.multi_lora.acquire_lora(tenant, config)
        randomize(model, tenant, seed=20 + i)
        model.set_optimizer(optimizer, lr=0.01, adapter_name=tenant)
    return model


def _grads(model, tenant):
    spec = model.slots.specs[model.multi_lora.get(tenant).adapter_name]
    return [p.grad.clone() for p in model.slots.spec_parameters(spec)]


def test_fused_gradients_losses_and_updates_equal_the_sequential_path():
    """The updates are compared under SGD, where they follow from the gradients' bound: lr * |g_fused - g_seq|
    <= 0.01 * STEP * |g|, well inside the weights' (1e-6 + 1e-4 |w|). AdamW divides by sqrt(v) + 1e-8, so an
    element whose gradient is near 1e-8 turns the reordered sums' rounding into up to lr of weight: 6e-6 on one
    element under ATEN_CPU_CAPABILITY=default (no bound holds on every CPU). SGD also shows a wrong accumulation
    rescale (AdamW is blind to the gradient's scale)."""
    fused, sequential = _model("SGD"), _model("SGD")
    for tenant in TENANTS:
        for m in (fused, sequential):
            m.optimizer_group[m.multi_lora.get(tenant).adapter_name].gradient_accumulation_steps = 2
    for micro in range(2):
        got = fused.forward_backward_multi({t: make_batch(**BATCHES[t][micro]) for t in TENANTS})
        want = {t: sequential.forward_backward(inputs=make_batch(**BATCHES[t][micro]), adapter_name=t)
                for t in TENANTS}
        assert got == pytest.approx(want, rel=FWD)
    for tenant in TENANTS:
        for g_fused, g_seq in zip(_grads(fused, tenant), _grads(sequential, tenant), strict=True):
            assert g_seq.abs().sum() > 0
            _close(g_fused, g_seq)
    for tenant in TENANTS:
        norms = [m.clip_grad_norm(1.0, adapter_name=tenant) for m in (fused, sequential)]
        assert norms[0] == pytest.approx(norms[1], rel=STEP)
        for m in (fused, sequential):
            m.clip_grad_and_step(adapter_name=tenant)
        a = fused.get_state_dict(adapter_name=tenant)
        b = sequential.get_state_dict(adapter_name=tenant)
        # SGD: a weight moves by lr * g, g within _close's bound (within(): at most (1 + sqrt(128)) STEP of the
        # largest gradient, itself at most the clipped norm 1), and the stored weights one ulp (2 u |w|) apart
        torch.testing.assert_close(a, b, rtol=2 * U, atol=0.01 * STEP * (1 + 128**0.5))
        metrics = [m.calculate_metric(True, adapter_name=tenant) for m in (fused, sequential)]
        assert metrics[0]["loss"] == pytest.approx(metrics[1]["loss"], rel=FWD)
        assert metrics[0]["step"] == metrics[1]["step"] == 1


def test_tenant_rows_do_not_leak_into_other_tenants():
    """A tenant's gradient does not change when another tenant's rows in the same pass change."""
    grads = []
    for other_seed in (30, 31):
        model = _model()
        model.forward_backward_multi({"a": make_batch(7, rows=2), "b": make_batch(other_seed, rows=3)})
        grads.append(_grads(model, "a"))
    for g0, g1 in zip(*grads, strict=True):
        _close(g0, g1)


def test_bad_multi_batches_are_refused_without_state_change():
    model = _model()
    model.max_length = 16
    before = {t: (g.micro_step, g.total_micro_steps) for t, g in model.optimizer_group.items()}
    with pytest.raises(KeyError, match="ghost"):
        model.forward_backward_multi({"a": make_batch(1), "ghost": make_batch(2)})
    with pytest.raises(ValueError, match="same tenant twice"):
        model.forward_backward_multi({"a": make_batch(1), "lora_0": make_batch(2)})
    with pytest.raises(ValueError, match="max_length=16"):
        model.forward_backward_multi({"a": make_batch(1), "b": make_batch(2, length=20)})
    with pytest.raises(TypeError, match="non-empty dict"):
        model.forward_backward_multi({})
    with pytest.raises(ValueError, match="causal_lm"):
        model.forward_backward_multi({"a": make_batch(1)}, task="embedding")
    assert {t: (g.micro_step, g.total_micro_steps) for t, g in model.optimizer_group.items()} == before
    assert all(p.grad is None for t in TENANTS for p in model.slots.spec_parameters(model.slots.specs[
        model.multi_lora.get(t).adapter_name]))


def test_a_tenant_left_out_of_the_batch_stays_bit_identical():
    model = _model()
    model.forward_backward(inputs=make_batch(40), adapter_name="c")  # c: pending gradients, not stepped
    before = tenant_hash(model, "c")
    model.forward_backward_multi({"a": make_batch(41), "b": make_batch(42)})
    for tenant in ("a", "b"):
        model.clip_grad_and_step(adapter_name=tenant)
    assert tenant_hash(model, "c") == before


def _rows(batch: dict) -> list[dict]:
    """A padded batch as the DataLoader yields it: a list of encoded rows (with position_ids)."""
    rows = []
    for ids, mask, labels in zip(batch["input_ids"], batch["attention_mask"], batch["labels"], strict=True):
        n = int(mask.sum())
        rows.append({"input_ids": ids[:n].tolist(), "labels": labels[:n].tolist(), "attention_mask": [1] * n,
                     "position_ids": list(range(n)), "length": n})
    return rows


def test_dataloader_rows_are_accepted_like_tensor_batches():
    fused, sequential = _model(), _model()
    batches = {t: make_batch(**BATCHES[t][0]) for t in TENANTS}
    got = fused.forward_backward_multi({t: _rows(b) for t, b in batches.items()})
    want = {t: sequential.forward_backward(inputs=_rows(b), adapter_name=t) for t, b in batches.items()}
    assert got == pytest.approx(want, rel=FWD)
    for tenant in TENANTS:
        for g_fused, g_seq in zip(_grads(fused, tenant), _grads(sequential, tenant), strict=True):
            _close(g_fused, g_seq)


class _MatmulCount(TorchDispatchMode):
    """Counts the matrix products the dispatcher runs (forward and backward)."""

    PRODUCTS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in self.PRODUCTS
        return func(*args, **(kwargs or {}))


def test_the_batched_step_runs_the_same_matmuls_for_any_number_of_tenants():
    """The tenants' rows go through each LoRA layer together (two products per layer and pass), not one tenant
    after another: a third tenant in the batch adds rows, not products."""
    model = _model("SGD")
    counts = []
    for tenants in (("a", "b"), ("a", "b", "c")):
        with _MatmulCount() as mode:
            model.forward_backward_multi({t: make_batch(50 + i, rows=1, length=8) for i, t in enumerate(tenants)})
        counts.append(mode.count)
    assert counts[0] == counts[1], counts
