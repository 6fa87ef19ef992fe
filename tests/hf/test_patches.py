"""Built-in model patches: GradientCheckpointing (also TransformersModel(gradient_checkpointing=True)) and
TransformersFusedCEPatch; both by name through apply_patch, both listed by ``twinkle plugins``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from hf_testing import make_batch, make_model, tiny_config
from peft import LoraConfig
from rounding import chain_bound
from transformers import AutoModelForCausalLM

from twinkle.kernel import TensorMemoryTracker
from twinkle.patch import GradientCheckpointing, Patch
from twinkle.registry import resolve

#: the fused CE: the head (64 terms), the log-sum-exp (vocabulary 128) and the sum over 4 x 12 tokens
LOSS = chain_bound(64, 128, 48)


def _train(model, steps: int = 2) -> tuple[list[float], int, dict[str, torch.Tensor]]:
    """Losses, the tensor-memory peak of the first forward_backward, then the trained weights."""
    losses, peak = [], 0
    for step in range(steps):
        batch = make_batch(step, rows=4, length=64, pad_to=64)
        if step == 0:
            with TensorMemoryTracker() as tracker:
                losses.append(model.forward_backward(batch))
            peak = tracker.peak_bytes
        else:
            losses.append(model.forward_backward(batch))
        model.clip_grad_and_step()
    return losses, peak, {k: v.detach().clone() for k, v in model.model.state_dict().items()}


@pytest.mark.parametrize("lora", [False, True])
def test_gradient_checkpointing_gives_the_same_training_with_a_lower_peak(lora):
    runs = {}
    for checkpointing in (False, True):
        model = make_model(seed=4, config=tiny_config(num_hidden_layers=3), gradient_checkpointing=checkpointing)
        if lora:
            model.add_adapter_to_model("sft", LoraConfig(r=4, target_modules="all-linear"))
        model.set_optimizer("AdamW", lr=1e-2)
        runs[checkpointing] = _train(model)
        assert model.backend.hf_model().is_activation_checkpointing is checkpointing
    (plain_losses, plain_peak, plain_state), (ckpt_losses, ckpt_peak, ckpt_state) = runs[False], runs[True]
    assert ckpt_losses == plain_losses  # exact: recomputation is the same arithmetic on the same inputs
    for key, value in plain_state.items():
        torch.testing.assert_close(ckpt_state[key], value, rtol=0, atol=0)
    assert ckpt_peak < 0.8 * plain_peak, (ckpt_peak, plain_peak)


def test_gradient_checkpointing_on_any_module_with_layers_and_revert():
    """A module without transformers' switch: each layer of its largest ModuleList is checkpointed."""

    class Stack(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU())
                                              for _ in range(6))

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    torch.manual_seed(0)
    stack, x = Stack(), torch.randn(512, 256)

    def peak_and_grads():
        stack.zero_grad()
        with TensorMemoryTracker() as tracker:
            stack(x).square().sum().backward()
        return tracker.peak_bytes, [p.grad.clone() for p in stack.parameters()]

    plain_peak, plain_grads = peak_and_grads()
    patch = GradientCheckpointing()
    patch.apply(stack)
    ckpt_peak, ckpt_grads = peak_and_grads()
    assert ckpt_peak < 0.7 * plain_peak  # each layer keeps its input only, not its Linear output too
    for a, b in zip(ckpt_grads, plain_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    patch.revert(stack)
    assert "forward" not in vars(stack.layers[0]) and peak_and_grads()[0] == plain_peak


def test_fused_ce_patch_on_the_transformers_module_and_on_the_twinkle_model():
    torch.manual_seed(1)
    hf = AutoModelForCausalLM.from_config(tiny_config())
    batch = make_batch(3)
    want = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    patch = resolve("patch", "TransformersFusedCEPatch")()
    assert isinstance(patch, Patch)
    patch.apply(hf)
    got = hf(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    assert got.logits is None and torch.isfinite(got.loss)
    # the same hidden states; the head and the loss in another order: float32's bound (tests/rounding.py)
    torch.testing.assert_close(got.loss, want.loss, rtol=LOSS, atol=0)
    assert hf(input_ids=batch["input_ids"]).logits.shape[-1] == hf.config.vocab_size  # no labels: unchanged
    patch.revert(hf)
    assert hf(input_ids=batch["input_ids"], labels=batch["labels"]).logits is not None

    plain, fused = make_model(seed=2), make_model(seed=2)
    fused.apply_patch("TransformersFusedCEPatch")
    assert fused.forward_backward(batch) == pytest.approx(plain.forward_backward(batch), rel=LOSS)
    assert fused.optimizer_group["default"].last_task == "fused_lm_ce"
    assert plain.optimizer_group["default"].last_task == "causal_lm"


def test_twinkle_plugins_lists_the_built_in_patches():
    out = subprocess.run([sys.executable, "-m", "twinkle.cli.main", "plugins", "--kind", "patch"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[1]: line.split()[2] for line in out.stdout.splitlines()[1:] if line.startswith("patch ")}
    assert rows["GradientCheckpointing"] == "twinkle-core" and rows["TransformersFusedCEPatch"] == "twinkle-hf"


def test_a_multi_tenant_model_takes_gradient_checkpointing_with_the_same_losses():
    """MultiLoraTransformersModel(gradient_checkpointing=True): the patch needs no tenant (there is none yet)."""
    from twinkle.model import MultiLoraTransformersModel

    losses = {}
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = MultiLoraTransformersModel(config=tiny_config(), mixed_precision="no", max_loras=2, max_r=4,
                                           gradient_checkpointing=checkpointing)
        assert model.backend.hf_model().is_gradient_checkpointing is checkpointing
        model.acquire_lora("t", LoraConfig(r=4, lora_alpha=8, target_modules="all-linear"), seed=1)
        model.set_optimizer("AdamW", lr=1e-2, adapter_name="t")
        losses[checkpointing] = []
        with model.multi_lora.adapter("t"):
            for step in range(2):
                losses[checkpointing].append(float(model.forward_backward(make_batch(step))))
                model.clip_grad_and_step()
    assert losses[True] == losses[False]  # exact: recomputation is the same arithmetic
    with pytest.raises(KeyError, match="nobody"):
        model.apply_patch("GradientCheckpointing", adapter_name="nobody")  # a name given is still checked
