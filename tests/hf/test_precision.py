"""Mixed precision: no / bf16 autocast on CPU / fp16 with a GradScaler (fp8: test_fp8.py)."""

from __future__ import annotations

import pytest
import torch
from hf_testing import make_batch, make_model, tensor_hash, tiny_config


def test_bf16_autocasts_on_cpu_and_keeps_fp32_weights() -> None:
    fp32, bf16 = make_model(seed=1, mixed_precision="no"), make_model(seed=1, mixed_precision="bf16")
    batch = make_batch(0)
    out32 = fp32.forward_only(inputs=batch).logits
    out16 = bf16.forward_only(inputs=batch).logits
    assert out32.dtype == torch.float32 and out16.dtype == torch.bfloat16
    # measured, kept: bf16 against fp32 logits (bf16's own bound, u = 2**-8 per rounding, is ~0.1 and could not fail)
    torch.testing.assert_close(out16.float(), out32, rtol=0.05, atol=0.05)
    bf16.set_optimizer("AdamW", lr=1e-2)
    before = tensor_hash(bf16.get_state_dict())
    bf16.forward_backward(inputs=batch)
    bf16.clip_grad_and_step()
    assert tensor_hash(bf16.get_state_dict()) != before
    assert all(p.dtype == torch.float32 for p in bf16.model.parameters())


def test_fp16_uses_a_configured_grad_scaler_and_checkpoints_it(tmp_path) -> None:
    model = make_model(seed=2, mixed_precision="fp16", grad_scaler_config={"init_scale": 2.0**40})
    model.set_optimizer("SGD", lr=0.1)
    group = model.optimizer_group["default"]
    assert isinstance(group.scaler, torch.amp.GradScaler)
    before = tensor_hash(model.get_state_dict())
    model.forward_backward(inputs=make_batch(1))
    model.clip_grad_and_step()
    # the loss scaled by 2**40 overflows fp16 gradients: the scaler skips the step and backs off
    assert tensor_hash(model.get_state_dict()) == before
    assert group.scaler.get_scale() == 2.0**39
    for i in range(60):  # back off until fp16 gradients are finite, then steps apply
        model.forward_backward(inputs=make_batch(i))
        model.clip_grad_and_step()
        if tensor_hash(model.get_state_dict()) != before:
            break
    assert tensor_hash(model.get_state_dict()) != before
    path = model.save("fp16", output_dir=str(tmp_path), save_optimizer=True)
    saved = torch.load(tmp_path / "fp16" / "scaler.pt", weights_only=True)
    assert saved["scale"] == group.scaler.get_scale()

    fresh = make_model(seed=3, mixed_precision="fp16")
    fresh.set_optimizer("SGD", lr=0.1)
    fresh.resume_from_checkpoint(path)
    assert fresh.optimizer_group["default"].scaler.state_dict() == group.scaler.state_dict()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_and_fp16_train_on_gpu(monkeypatch) -> None:
    monkeypatch.delenv("TWINKLE_DEVICE", raising=False)
    for precision in ("bf16", "fp16"):
        model = make_model(seed=4, mixed_precision=precision)
        assert model.device.type == "cuda"
        model.set_optimizer("AdamW", lr=1e-2)
        losses = []
        batch = make_batch(5)
        for _ in range(5):
            losses.append(model.forward_backward(inputs=batch))
            model.clip_grad_and_step()
        assert losses[-1] < losses[0]


@pytest.mark.parametrize("precision,low", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_lora_holds_the_frozen_base_in_low_precision_and_adapters_in_fp32(precision, low) -> None:
    """No fp32 copy of a frozen weight: 2 bytes per base parameter; every adapter's weights (and a
    modules_to_save copy) stay fp32 master weights, also after a second adapter is added."""
    from peft import LoraConfig

    model = make_model(seed=5, mixed_precision=precision, config=tiny_config("qwen2", tie_word_embeddings=True))
    model.add_adapter_to_model("a", LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["norm"]))
    model.add_adapter_to_model("b", LoraConfig(r=4, target_modules=["k_proj"]))
    hf = model.backend.hf_model()
    assert hf.get_input_embeddings().weight is hf.get_output_embeddings().weight  # still tied
    trainable = {id(p) for g in model.optimizer_group.values() for p in model.backend.parameters(g)}
    for name, param in model.model.named_parameters():
        assert param.dtype == (torch.float32 if id(param) in trainable else low), name
    assert any(".modules_to_save.a." in n for n, _ in model.model.named_parameters())
    model.set_optimizer("AdamW", lr=1e-2, adapter_name="a")
    before = tensor_hash(model.get_state_dict(adapter_name="a"))
    model.forward_backward(inputs=make_batch(1), adapter_name="a")
    model.clip_grad_and_step(adapter_name="a")
    assert tensor_hash(model.get_state_dict(adapter_name="a")) != before
