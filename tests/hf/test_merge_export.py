"""A LoRA adapter merged into its base model (``merged_model``, the trainer's ``lora.merge_on_export``):
on one process, and under FSDP2 on two ranks, compared with plain peft computing base + adapter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_testing import make_batch, make_model
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM

from twinkle.config import ConfigError

#: Merged (W + s*B@A) and unmerged (W@x + s*B@(A@x)) fp32 logits are the same real sums in another order.
#: A logit passes through at most 2 layers x 7 LoRA linears + lm_head = 15 matmuls, each with inner length
#: <= 128 + r; each reorders to first order by <= 2 * n * 2**-24 relative to the sum of |terms|, which for
#: these near-unit activations is of the order of the largest logit. So |diff| <= RHO * max|logit|.
RHO = 2 * 15 * (128 + 8) * 2.0**-24  # 2.4e-4


def _lora(targets: list[str] | str) -> LoraConfig:
    return LoraConfig(r=8, lora_alpha=16, target_modules=targets, init_lora_weights=False)


def _close(merged: torch.Tensor, reference: torch.Tensor) -> None:
    torch.testing.assert_close(merged, reference, rtol=0, atol=RHO * float(reference.abs().max()))


def test_merged_model_computes_base_plus_adapter_and_leaves_training_model_unmerged() -> None:
    model = make_model(seed=3)
    model.add_adapter_to_model("a", _lora(["q_proj", "v_proj", "lm_head"]))
    model.add_adapter_to_model("b", _lora(["up_proj"]))  # another adapter on other modules: left out of the merge
    model.set_optimizer("SGD", lr=0.1, adapter_name="a")
    model.forward_backward(inputs=make_batch(0), adapter_name="a")
    model.clip_grad_and_step(adapter_name="a")
    embed_before = model.backend.hf_model().get_input_embeddings().weight.detach().clone()

    merged = model.merged_model("a")
    assert not isinstance(merged, PeftModel) and not any("lora" in k for k in merged.state_dict())
    ids = make_batch(1)["input_ids"]
    peft_model = model.model
    peft_model.eval()
    peft_model.set_adapter("a")
    with torch.no_grad():
        reference = peft_model(input_ids=ids).logits
        with peft_model.disable_adapter():
            base = peft_model(input_ids=ids).logits
        got = merged(input_ids=ids).logits
    _close(got, reference)
    assert float((got - base).abs().max()) > 100 * RHO * float(reference.abs().max())  # the adapter is in it
    # the training model is untouched: still LoRA-wrapped, its tied embedding unchanged and shared with lm_head
    hf = model.backend.hf_model()
    assert torch.equal(hf.get_input_embeddings().weight, embed_before)
    assert any("lora_A.a" in k for k in hf.state_dict())
    assert merged.get_output_embeddings().weight.data_ptr() != merged.get_input_embeddings().weight.data_ptr()


def test_merged_model_refuses_what_it_cannot_merge() -> None:
    model = make_model(seed=3)
    with pytest.raises(ConfigError, match="no LoRA adapter to merge"):
        model.merged_model("default")
    model.add_adapter_to_model("a", _lora(["q_proj"]))
    with pytest.raises(ConfigError, match=r"adapter 'nope' is not one of the model's adapters \['a'\]"):
        model.merged_model("nope")


@pytest.mark.slow
def test_merge_on_export_under_fsdp2_writes_the_full_merged_model_on_rank0(tmp_path: Path) -> None:
    """Two ranks, fsdp_size=2: every rank joins the gather and rank 0 writes a full model that plain
    transformers loads and that computes what plain peft computes from the same step's adapter checkpoint."""
    import yaml

    from twinkle.hub import resolve_path

    work_dir = tmp_path / "wd"
    job = {"work_dir": str(work_dir), "total_step": 2, "global_batch_size": 4, "progress_bar": False,
           "dataloader": {"gradient_accumulation_steps": 1}, "dataset": {"train_samples": 8, "max_length": 64},
           "checkpoint_interval": 2, "hf_interval": 1, "lora": {"merge_on_export": True},
           "infra": {"fsdp_size": 2}, "mixed_precision": "no",
           "optimizer": {"name": "SGD", "lr": 0.05}, "lr": {"scheduler": None}}
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(job))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "TRANSFORMERS_VERBOSITY": "error",
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "twinkle.cli.main", "train", str(config)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]

    base_dir = str(resolve_path("twinkle://tiny-qwen"))
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    shapes = {k: tuple(v.shape) for k, v in base.state_dict().items()}
    ids = torch.tensor([[1, 5, 9, 42, 7, 3, 11, 2]])
    with torch.no_grad():
        base_logits = base(ids).logits
        exports = {}
        for step in (1, 2):
            merged = AutoModelForCausalLM.from_pretrained(work_dir / "hf" / f"step-{step:08d}", dtype=torch.float32)
            # full tensors, not rank 0's shards
            assert {k: tuple(v.shape) for k, v in merged.state_dict().items()} == shapes
            exports[step] = merged(ids).logits
        reference = PeftModel.from_pretrained(base, work_dir / "checkpoints" / "step-00000002" / "model")(ids).logits
    _close(exports[2], reference)
    scale = RHO * float(reference.abs().max())
    assert float((exports[2] - base_logits).abs().max()) > 100 * scale  # the trained adapter is merged in
    assert float((exports[2] - exports[1]).abs().max()) > 100 * scale  # each export is its own step's
