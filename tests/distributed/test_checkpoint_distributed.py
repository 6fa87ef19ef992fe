"""Sharded save on 2 ranks: resume continues identically, and the HF export loads in one process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from peft import PeftModel
from rounding import tiny_hf, within
from scenarios import probe_batch, tiny_config
from transformers import AutoModelForCausalLM

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)


@pytest.mark.parametrize("name", ["resume_fsdp_lora", "resume_fsdp_full", "resume_ddp_lora"])
def test_resume_on_two_ranks_continues_exactly(name: str, training_job) -> None:
    for rank in (0, 1):
        got = training_job.load(name, rank)
        assert got["progress"] == {"cur_step": 3, "consumed_train_samples": 12, "gradient_accumulation_steps": 1}
        assert got["resumed"] == got["continued"]  # bitwise: same world size, same shards
        for key, value in got["continued_params"].items():
            torch.testing.assert_close(got["resumed_params"][key], value, rtol=0, atol=0)


@pytest.mark.parametrize("name,lora", [("resume_fsdp_lora", True), ("resume_fsdp_full", False),
                                       ("resume_ddp_lora", True)])
def test_export_loads_in_one_process_with_identical_logits(name: str, lora: bool, training_job) -> None:
    got = training_job.load(name, 0)
    path = Path(got["path"])
    files = {p.name for p in path.iterdir()}
    assert {"trainer_state.json", "rng_state.pt", "rng_state.rank1.pt", "scheduler.pt", "dcp_model",
            "dcp_optimizer"} <= files
    assert not [p for p in path.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    if lora:
        assert {"adapter_model.safetensors", "adapter_config.json"} <= files
        torch.manual_seed(0)
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_config(tiny_config("qwen2")), str(path))
    else:
        assert "model.safetensors" in files
        assert '"Qwen2ForCausalLM"' in (path / "config.json").read_text()  # not FSDP's class name
        model = AutoModelForCausalLM.from_pretrained(str(path))
    batch = probe_batch()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    # one process (this one's threads) against the ranks' forward: float32 summation order only, a forward's
    # bound (tests/rounding.py, 2 rows of 10 tokens) relative to the largest logit; a wrong tensor moves all
    bound = tiny_hf(seq=10, rows=2).forward_bound()
    torch.testing.assert_close(logits, got["logits_at_save"], **within(bound, got["logits_at_save"]))
    torch.testing.assert_close(training_job.load(name, 1)["logits_at_save"], got["logits_at_save"], rtol=0, atol=0)


@pytest.mark.parametrize("name", ["resume_fsdp_lora", "resume_fsdp_full", "resume_ddp_lora"])
def test_export_loads_into_a_sharded_model(name: str, training_job) -> None:
    """model.load(export) on 2 FSDP2 ranks gives the logits the model had when it was saved."""
    for rank in (0, 1):
        got = training_job.load(name, rank)
        # exact: the same ranks run the same kernels on the same weights (a float32 safetensors round trip)
        torch.testing.assert_close(got["logits_loaded_export"], got["logits_at_save"], rtol=0, atol=0)
