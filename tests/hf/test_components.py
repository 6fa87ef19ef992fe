"""Optimizers (incl. Muon), schedulers, losses and metrics by name, class, instance or callable."""

from __future__ import annotations

import math

import pytest
import torch
from hf_testing import make_batch, make_model
from peft import LoraConfig
from rounding import chain_bound, tiny_hf, within

from twinkle.loss import CrossEntropyLoss, Loss
from twinkle.metric import Metric
from twinkle_hf.model.optim import MuonWithAdamW

#: a forward of the tiny model on 4 rows of 12 tokens: float32's bound for another summation order (tests/rounding.py)
FWD = tiny_hf(12, 4).forward_bound()


def test_muon_full_model_splits_matrices_from_the_rest() -> None:
    model = make_model()
    model.set_optimizer("Muon", lr=0.02, adjust_lr_fn="match_rms_adamw")
    opt = model.optimizer_group["default"].optimizer
    assert isinstance(opt, MuonWithAdamW)
    hf = model.backend.hf_model()
    muon_ids = {id(p) for g in opt.muon.param_groups for p in g["params"]}
    adamw_ids = {id(p) for g in opt.adamw.param_groups for p in g["params"]}
    embeddings = {id(hf.get_input_embeddings().weight), id(hf.get_output_embeddings().weight)}
    for name, p in hf.named_parameters():
        if p.ndim == 2 and id(p) not in embeddings:
            assert id(p) in muon_ids, name
        else:
            assert id(p) in adamw_ids, name
    assert muon_ids.isdisjoint(adamw_ids) and len(muon_ids | adamw_ids) == len(list(hf.parameters()))
    assert opt.muon.param_groups[0]["adjust_lr_fn"] == "match_rms_adamw"

    # Muon's update of a matrix equals torch's Muon run alone on the same gradient
    weight = hf.model.layers[0].mlp.down_proj.weight
    before = weight.detach().clone()
    model.forward_backward(inputs=make_batch(0))
    grad = weight.grad.detach().clone()
    model.clip_grad_and_step(max_grad_norm=None)
    ref = torch.nn.Parameter(before.clone())
    ref.grad = grad
    torch.optim.Muon([ref], lr=0.02, adjust_lr_fn="match_rms_adamw").step()
    torch.testing.assert_close(weight.detach(), ref.detach(), rtol=0, atol=0)


def test_muon_with_lora_is_plain_muon() -> None:
    model = make_model()
    model.add_adapter_to_model("sft", LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    model.set_optimizer(torch.optim.Muon, lr=0.02, adjust_lr_fn="match_rms_adamw")
    assert type(model.optimizer_group["sft"].optimizer) is torch.optim.Muon


def test_optimizer_by_class_and_instance() -> None:
    model = make_model()
    model.set_optimizer(torch.optim.SGD, lr=0.5, momentum=0.9)
    assert model.optimizer_group["default"].optimizer.defaults["momentum"] == 0.9
    params = [p for p in model.model.parameters() if p.requires_grad]
    instance = torch.optim.Adam(params, lr=1e-4)
    model.set_optimizer(instance)
    assert model.optimizer_group["default"].optimizer is instance


def test_warmup_schedulers_count_optimizer_steps() -> None:
    model = make_model()
    model.set_optimizer("SGD", lr=1.0)
    model.set_lr_scheduler("CosineWarmupScheduler", num_warmup_steps=2, num_training_steps=6)
    group = model.optimizer_group["default"]
    seen = []
    for i in range(12):  # 12 micro-batches, accumulation 2 -> 6 optimizer steps
        seen.append(group.optimizer.param_groups[0]["lr"])
        model.forward_backward(inputs=make_batch(i), gradient_accumulation_steps=2)
        model.clip_grad_and_step()
    expected = []
    for step in range(6):
        lr = step / 2 if step < 2 else 0.5 * (1 + math.cos(math.pi * (step - 2) / 4))
        expected += [lr, lr]
    assert seen == pytest.approx(expected)  # Python floats on both sides: the schedule's double rounding only
    assert group.cur_step == 6


def test_loss_by_name_instance_and_callable() -> None:
    batch = make_batch(3)
    values = {}
    for label, loss in (("name", "CrossEntropyLoss"), ("class", CrossEntropyLoss), ("instance", CrossEntropyLoss())):
        model = make_model(seed=4)
        model.set_loss(loss)
        model.forward(inputs=batch)
        values[label] = model.calculate_loss()
    assert values["name"] == values["class"] == values["instance"]

    calls = []

    def first_token_loss(inputs, outputs):
        calls.append(sorted(inputs))
        return outputs.logits[:, 0].float().logsumexp(-1).mean()

    model = make_model(seed=4)
    model.set_loss(first_token_loss)
    model.set_optimizer("SGD", lr=0.1)
    value = model.forward_backward(inputs=batch)
    with torch.no_grad():
        expected = model.forward_only(inputs=batch).logits[:, 0].logsumexp(-1).mean()
    assert value == pytest.approx(float(expected), rel=FWD)  # the training forward against the eval one
    assert "labels" in calls[0]


def test_sum_reduction_loss_trains_like_mean() -> None:
    """set_loss(..., reduction='sum') (seed 003's fused CE call) still applies a token-mean update."""
    batch = make_batch(5)
    models = []
    for reduction in ("mean", "sum"):
        model = make_model(seed=6)
        model.set_loss("CrossEntropyLoss", reduction=reduction)
        model.set_optimizer("SGD", lr=0.1)
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
        models.append(model)
    for p, q in zip(models[0].model.parameters(), models[1].model.parameters()):
        assert torch.equal(p, q)


def test_custom_loss_subclass_and_metric() -> None:
    class MaskedTokens(Metric):
        def __init__(self) -> None:
            self.count = 0

        def update(self, inputs, outputs) -> None:
            self.count += int((inputs["labels"] == -100).sum())

        def compute(self) -> dict[str, float]:
            return {"masked_tokens": float(self.count)}

        def reset(self) -> None:
            self.count = 0

    class ZLoss(Loss):
        def compute(self, inputs, outputs, **kwargs):
            z = outputs.logits.float().logsumexp(-1)
            return (z ** 2).sum(), z.numel()

    model = make_model()
    model.add_metric(MaskedTokens, is_training=True)
    model.set_loss(ZLoss)
    model.set_optimizer("SGD", lr=1e-3)
    batch = make_batch(7)
    model.forward_backward(inputs=batch)
    metrics = model.calculate_metric(is_training=True)
    assert metrics["masked_tokens"] == float((batch["labels"] == -100).sum())
    with torch.no_grad():
        z = model.forward_only(inputs=batch).logits.logsumexp(-1)
    assert metrics["loss"] == pytest.approx(float((z ** 2).mean()), rel=FWD)
    assert "masked_tokens" not in model.calculate_metric(is_training=False)


def test_template_and_processor_by_name() -> None:
    from twinkle.processor import InputProcessor

    model = make_model()
    model.set_processor("InputProcessor", padding_free=True)
    assert isinstance(model.optimizer_group["default"].processor, InputProcessor)
    assert model.optimizer_group["default"].processor.padding_free
    model.set_template("ChatMLTemplate", max_length=64)
    template = model.optimizer_group["default"].template
    assert template.max_length == 64
    config = model.get_train_configs()
    assert "ChatMLTemplate" in config and "InputProcessor" in config and "trainable" in config


def test_fused_lm_ce_task_matches_causal_lm_cross_entropy() -> None:
    """seed 003's task='fused_lm_ce' + LigerFusedLinearCrossEntropyLoss (torch chunked kernel on CPU)."""
    batch = make_batch(8)
    reference = make_model(seed=9)
    expected = reference.forward_backward(inputs=batch)
    fused = make_model(seed=9)
    fused.set_loss("LigerFusedLinearCrossEntropyLoss", reduction="sum")
    got = fused.forward_backward(inputs=batch, task="fused_lm_ce")
    assert got == pytest.approx(expected, rel=chain_bound(64, 128, 48))  # the same hidden: the head and the loss
    for p, q in zip(fused.model.parameters(), reference.model.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **within(tiny_hf(12, 4).step_bound(), q.grad))


def test_apply_patch_and_metric_by_name() -> None:
    class ScaleNorms:
        """A patch: multiplies every RMSNorm weight (visible in the forward)."""

        def __init__(self, factor: float) -> None:
            self.factor = factor

        def apply(self, model) -> None:
            for module in model.modules():
                if type(module).__name__.endswith("RMSNorm"):
                    module.weight.data.mul_(self.factor)

    model = make_model(seed=10)
    batch = make_batch(9)
    before = model.forward_only(inputs=batch).logits
    model.apply_patch(ScaleNorms, factor=2.0)
    assert not torch.allclose(model.forward_only(inputs=batch).logits, before)
    assert isinstance(model.patches[0], ScaleNorms)
    with pytest.raises(LookupError, match="Unknown patch 'NoSuchPatch'"):
        model.apply_patch("NoSuchPatch")
    model.add_metric("TokenAccuracy", is_training=False, name="acc2")
    model.forward_only(inputs=batch)
    model.calculate_loss()
    metrics = model.calculate_metric(is_training=False)
    assert metrics["acc2"] == metrics["token_accuracy"]


def test_set_optimizer_params_keeps_the_optimizer_state() -> None:
    """Changing lr/betas mid-run (a client-driven schedule) equals a fresh AdamW state-copied with the new values."""
    batches = [make_batch(20 + i) for i in range(3)]
    changed, reference = make_model(seed=3), make_model(seed=3)
    for model in (changed, reference):
        model.set_optimizer("AdamW", lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
        model.forward_backward(inputs=batches[0])
        model.clip_grad_and_step(max_grad_norm=None)
    state_before = {k: v.clone() for k, v in changed.optimizer_group["default"].optimizer.state[
        next(iter(changed.optimizer_group["default"].optimizer.state))].items()}
    assert changed.set_optimizer_params(lr=3e-3, betas=(0.8, 0.9), weight_decay=0.1) == {
        "lr": 3e-3, "betas": (0.8, 0.9), "weight_decay": 0.1}
    state_after = changed.optimizer_group["default"].optimizer.state[
        next(iter(changed.optimizer_group["default"].optimizer.state))]
    for key, value in state_before.items():  # moments and step count untouched
        assert torch.equal(value, state_after[key]), key
    # the reference: the same AdamW update written out with the new values (torch's own optimizer)
    ref_opt = reference.optimizer_group["default"].optimizer
    for group in ref_opt.param_groups:
        group["lr"], group["betas"], group["weight_decay"] = 3e-3, (0.8, 0.9), 0.1
    for model in (changed, reference):
        model.forward_backward(inputs=batches[1])
        model.clip_grad_and_step(max_grad_norm=None)
    for p, q in zip(changed.model.parameters(), reference.model.parameters()):
        assert torch.equal(p, q)
    with pytest.raises(TypeError, match=r"no hyper-parameters \['momentum'\]"):
        changed.set_optimizer_params(momentum=0.9, lr=1.0)
    assert changed.optimizer_group["default"].optimizer.param_groups[0]["lr"] == 3e-3  # nothing changed
    fresh = make_model(seed=3)
    with pytest.raises(RuntimeError, match="has no optimizer"):
        fresh.set_optimizer_params(lr=1.0)
