"""cookbook/transformers/fsdp2.py (the script seed 000 points users to) for a few steps under torchrun, fsdp=2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from trainer_testing import REPO, cli_env


@pytest.mark.slow
def test_fsdp2_cookbook_trains_sharded_saves_and_its_adapter_loads_in_peft(tmp_path: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from twinkle.hub import resolve_path

    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(REPO / "cookbook" / "transformers" / "fsdp2.py"), "--fsdp-size", "2", "--mixed-precision", "no",
           "--train-samples", "16", "--eval-samples", "4", "--batch-size", "4", "--eval-interval", "2",
           "--log-interval", "1"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=cli_env(OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = tmp_path / "output" / "fsdp2"
    last = out / "last-checkpoint"
    state = json.loads((last / "trainer_state.json").read_text())
    assert (state["cur_step"], state["consumed_train_samples"], state["world_size"]) == (4, 16, 2)
    assert "fsdp" in state["strategy"] and (last / "dcp_model").is_dir() and (last / "dcp_optimizer").is_dir()
    assert (out / "checkpoint-2" / "adapter_model.safetensors").is_file()  # the best eval so far
    assert "step 4/4" in proc.stderr and "eval at step 4" in proc.stderr
    base = AutoModelForCausalLM.from_pretrained(resolve_path("twinkle://tiny-qwen"))
    peft_model = PeftModel.from_pretrained(base, last).eval()
    ids = torch.tensor([[5, 17, 99, 3]])
    with peft_model.disable_adapter():
        plain = peft_model(input_ids=ids).logits
    assert not torch.allclose(peft_model(input_ids=ids).logits, plain)  # the trained adapter changes the model
