"""MegatronModel's training API on CPU (tp=pp=1, the CPU stand-in optimizer) against an HF reference loop.

The reference is written by hand on the HF model: twinkle's token-mean cross entropy, torch AdamW
with megatron's parameter groups (no weight decay on biases and 1-D weights), torch's
clip_grad_norm_. Tolerances: megatron and HF run the same float32 sums in other orders, so losses, grad norms
and gradients differ within the forward's and the step's bound of tests/rounding.py (4 rows of 12 tokens);
weights after three steps of AdamW with eps = 1 (Lipschitz in the gradient; eps = 1e-8 turns the rounding of the
k-projection bias's mathematically zero gradient into updates of +-lr, bounded on no CPU) within three steps'
bound of the update, plus the rounding of a zero gradient's terms (of the size of the step's gradient norm).
"""

from __future__ import annotations

import math

import pytest
import torch
from megatron_testing import hf_loss, hf_model, make_batch, megatron_model, save_hf
from rounding import U, tiny_hf

from twinkle_megatron.errors import MegatronConfigError

LR, WD = 1e-2, 0.1
FWD, STEP = tiny_hf(12, 4, vocab=125).forward_bound(), tiny_hf(12, 4, vocab=125).step_bound()
BOUND = (2 * (3 - 1) + 1) * STEP  # three steps, each carrying the earlier ones' rounding twice (Adam, eps = 1)


def _same_grads(a, b, name):
    """Gradients within the step's bound; a mathematically zero one (the k-projection bias) is rounding of terms
    of the size of the largest gradient, hence the absolute part from it (rounding.within's sqrt(terms))."""
    scale = max(float(p.grad.abs().max()) for _, p in b)
    for (name, x), (_, y) in zip(a, b):
        assert torch.allclose(x.grad, y.grad, rtol=STEP, atol=STEP * math.sqrt(128) * scale), name


def _reference_optimizer(model):
    decay = [p for n, p in model.named_parameters() if not (n.endswith(".bias") or p.ndim == 1)]
    no_decay = [p for n, p in model.named_parameters() if n.endswith(".bias") or p.ndim == 1]
    return torch.optim.AdamW([{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=LR, eps=1.0)


def test_three_steps_match_a_hand_written_hf_loop(tmp_path):
    hf = hf_model("llama")  # biases everywhere: their groups and gradients are exercised too
    model = megatron_model(save_hf(hf, tmp_path))
    model.set_optimizer("default", lr=LR, weight_decay=WD, adam_eps=1.0)
    hf.train()
    start, norms = {k: v.clone() for k, v in hf.state_dict().items()}, []
    reference = _reference_optimizer(hf)
    for step in range(3):
        batch = make_batch(seed=10 + step)
        loss = model.forward_backward(inputs=batch)
        norm = model.clip_grad_norm(0.5)
        model.step()
        model.zero_grad()

        ref_loss = hf_loss(hf, batch)
        ref_loss.backward()
        ref_norm = torch.nn.utils.clip_grad_norm_(hf.parameters(), 0.5)
        reference.step()
        reference.zero_grad()
        assert loss == pytest.approx(ref_loss.item(), rel=BOUND)
        assert norm == pytest.approx(float(ref_norm), rel=BOUND)
        norms.append(float(ref_norm))
    trained = model.get_state_dict()
    for name, param in hf.state_dict().items():
        update = float((param - start[name]).norm())
        room = BOUND * (update + LR * sum(norms)) + 3 * U * float(param.norm())
        assert float((trained[name] - param).norm()) <= room, name
        # the matrices moved far beyond the bound (biases and norm weights, whose gradients are sums of either
        # sign such as the k bias's exact zero, move less than the rounding of their terms may: compared only)
        assert update > 10 * room or param.ndim == 1, (name, update, room)


def test_accumulating_two_micro_batches_equals_one_token_weighted_batch(tmp_path):
    path = save_hf(hf_model("qwen2"), tmp_path)
    first, second = make_batch(seed=3), make_batch(seed=4, rows=2)
    joined = {k: torch.cat([first[k], second[k]]) for k in first}

    accumulated = megatron_model(path)
    accumulated.set_optimizer("default", lr=LR)
    before = accumulated.get_state_dict()
    accumulated.forward_backward(inputs=first, gradient_accumulation_steps=2)
    assert accumulated.clip_grad_norm(1.0) is None  # not a boundary yet: every stepping call is a no-op
    accumulated.step()
    assert all(torch.equal(before[k], v) for k, v in accumulated.get_state_dict().items())
    accumulated.forward_backward(inputs=second)
    acc_norm = accumulated.clip_grad_norm(1.0)  # boundary: gradients are now the window's token mean

    single = megatron_model(path)
    single.set_optimizer("default", lr=LR)
    single.forward_backward(inputs=joined)
    single_norm = single.clip_grad_norm(1.0)

    assert acc_norm == pytest.approx(single_norm, rel=STEP)
    _same_grads(list(accumulated.gpt.named_parameters()), list(single.gpt.named_parameters()), "accumulated")
    accumulated.step()
    assert accumulated.optimizer_group["default"].cur_step == 1
    assert any(not torch.equal(before[k], v) for k, v in accumulated.get_state_dict().items())


def test_separate_calls_equal_forward_backward(tmp_path):
    path = save_hf(hf_model("qwen3"), tmp_path)
    batch = make_batch(seed=5)
    split, fused = megatron_model(path), megatron_model(path)
    split.forward(inputs=batch)
    loss = split.calculate_loss()
    split.backward()
    # exact: the separate calls run forward_backward's operations on the same inputs
    assert loss == fused.forward_backward(inputs=batch)
    grads = {n: p.grad for n, p in split.gpt.named_parameters()}
    assert all(torch.equal(grads[n], p.grad) for n, p in fused.gpt.named_parameters())


def test_only_the_megatron_optimizer_and_scheduler_are_accepted(tmp_path):
    model = megatron_model(save_hf(hf_model("qwen2"), tmp_path))
    for bad in ("AdamW", torch.optim.SGD):
        with pytest.raises(MegatronConfigError, match=r"Pass 'default' or 'MegatronDistributedOptimizer'"):
            model.set_optimizer(bad, lr=1e-3)
    assert model.optimizer_group["default"].optimizer is None  # the failed calls changed nothing
    model.set_optimizer("MegatronDistributedOptimizer", lr=1e-3)
    driver = model.optimizer_group["default"].optimizer
    with pytest.raises(MegatronConfigError, match=r"Pass 'default' or 'OptimizerParamScheduler'"):
        model.set_lr_scheduler("CosineAnnealingLR", T_max=10)
    with pytest.raises(MegatronConfigError, match=r"unknown settings \['momentum'\]"):
        model.set_optimizer("default", momentum=0.9)
    assert model.optimizer_group["default"].optimizer is driver
    assert model.optimizer_group["default"].lr_scheduler is None


def test_default_scheduler_warms_up_then_decays_per_optimizer_step(tmp_path):
    model = megatron_model(save_hf(hf_model("qwen2"), tmp_path))
    model.set_optimizer("default", lr=1e-3)
    model.set_lr_scheduler("default", lr_warmup_steps=2, lr_decay_steps=6, lr_decay_style="cosine", min_lr=1e-4)
    seen = []
    for step in range(6):
        model.forward_backward(inputs=make_batch(seed=step), gradient_accumulation_steps=2)
        seen.append(model.calculate_metric(True).get("lr"))
        model.clip_grad_and_step(1.0)
    lrs = [seen[i] for i in (1, 3, 5)]  # lr used by optimizer steps 1..3 (every second micro-batch)
    cosine = 1e-4 + 0.5 * (1 + math.cos(math.pi * 1 / 4)) * (1e-3 - 1e-4)  # step 3: one step into the decay
    # Python floats on both sides: approx's 1e-6 is far above the schedules' double rounding (a few 1e-16)
    assert lrs == pytest.approx([0.0, 5e-4, 1e-3])  # megatron warm-up starts at init_lr=0
    assert model.optimizer_group["default"].optimizer.lr == pytest.approx(cosine)
    assert model.optimizer_group["default"].cur_step == 3


def test_metrics_are_plain_numbers(tmp_path):
    model = megatron_model(save_hf(hf_model("qwen2"), tmp_path))
    model.set_optimizer("default", lr=1e-3)
    losses = [model.forward_backward(inputs=make_batch(seed=s, ragged=False)) for s in (1, 2)]
    model.clip_grad_and_step(1.0, gradient_accumulation_steps=2)
    metrics = model.calculate_metric(True)
    # equal token counts: plain mean; float32's rounding of a 2-term mean (2**-24) is inside approx's 1e-6
    assert metrics["loss"] == pytest.approx(sum(losses) / 2)
    assert isinstance(metrics["grad_norm"], float) and metrics["grad_norm"] > 0
    assert 0.0 <= metrics["token_accuracy"] <= 1.0 and metrics["step"] == 1 and metrics["lr"] == 1e-3
    assert "MegatronModel: Qwen2ForCausalLM" in model.get_train_configs()


def test_microbatches_count_as_one_accumulation_step_with_the_same_gradient(tmp_path):
    path = save_hf(hf_model("qwen2"), tmp_path)
    batch = make_batch(seed=8)
    whole, split = megatron_model(path), megatron_model(path)
    for m in (whole, split):
        m.set_optimizer("default", lr=LR)
    loss = whole.forward_backward(inputs=batch)
    assert split.forward_backward(inputs=batch, num_microbatches=2) == pytest.approx(loss, rel=FWD)
    assert split.optimizer_group["default"].micro_step == 1  # one forward_backward call, one window entry
    assert split.clip_grad_norm(1.0) == pytest.approx(whole.clip_grad_norm(1.0), rel=STEP)
    _same_grads(list(split.gpt.named_parameters()), list(whole.gpt.named_parameters()), "split")
    with pytest.raises(MegatronConfigError, match=r"num_microbatches=3 must divide the batch's 4 rows"):
        split.forward_backward(inputs=batch, num_microbatches=3)


def test_a_step_the_optimizer_refuses_or_a_nan_loss_is_skipped(tmp_path, monkeypatch):
    """megatron's optimizer reporting no success (fp16 overflow on GPU) and an inf/NaN loss: no step counted,
    no lr change, no weight change; the metrics count the skips."""
    model = megatron_model(save_hf(hf_model("qwen2"), tmp_path))
    model.set_optimizer("default", lr=1e-3)
    model.set_lr_scheduler("default", lr_warmup_steps=2, lr_decay_steps=6)
    group = model.optimizer_group["default"]
    weights = {n: p.detach().clone() for n, p in model.gpt.named_parameters()}
    driver = group.optimizer
    monkeypatch.setattr(driver, "step", lambda: False)  # what MegatronDriver returns when found_inf
    model.forward_backward(inputs=make_batch(seed=1))
    model.clip_grad_and_step(1.0)
    assert group.cur_step == 0 and driver.lr == 0.0  # still at warm-up step 0
    monkeypatch.undo()
    model.set_loss(lambda inputs, outputs: outputs["logits"].float().mean() * float("nan"))
    for seed in (2, 3):
        model.forward_backward(inputs=make_batch(seed=seed), gradient_accumulation_steps=2)
    model.clip_grad_and_step(1.0)
    assert group.cur_step == 0 and driver.lr == 0.0
    for name, param in model.gpt.named_parameters():
        assert torch.equal(param.detach(), weights[name]), name
    metrics = model.calculate_metric(True)
    assert metrics["skipped_steps"] == 2 and metrics["step"] == 0
