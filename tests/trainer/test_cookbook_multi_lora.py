"""The multi-LoRA tenants cookbook runs on CPU for a few steps and leaves one plain PEFT adapter per tenant."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import torch
from peft import PeftModel
from trainer_testing import REPO, cli_env, load_weights
from transformers import AutoConfig, AutoModelForCausalLM

from twinkle.hub import resolve_path

EXPECTED = {"tenant_a": (4, {"q_proj", "v_proj"}), "tenant_b": (8, None),
            "tenant_c": (16, {"gate_proj", "up_proj", "down_proj"})}


def _tiny_base() -> torch.nn.Module:
    config = AutoConfig.from_pretrained(resolve_path("twinkle://tiny-qwen"))
    return AutoModelForCausalLM.from_config(config, torch_dtype=torch.float32)


def test_each_tenant_saves_a_loadable_adapter_with_its_rank(tmp_path: Path) -> None:
    script = REPO / "cookbook" / "transformers" / "multi_lora_tenants.py"
    proc = subprocess.run([sys.executable, str(script), "--steps", "2", "--train-samples", "24"], cwd=tmp_path,
                          env=cli_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = dict(re.findall(r"^(\w+): losses (.+)$", proc.stdout, re.M))
    paths = dict(re.findall(r"^(\w+): adapter (.+)$", proc.stdout, re.M))
    assert sorted(losses) == sorted(paths) == sorted(EXPECTED)
    for tenant, (r, targets) in EXPECTED.items():
        values = [float(x) for x in losses[tenant].split()]
        assert len(values) == 2 and all(math.isfinite(v) and v > 0 for v in values)
        path = Path(paths[tenant])
        assert path.parent == (tmp_path / "output" / "multi_lora_tenants").resolve()
        saved = load_weights(path)
        peft_model = PeftModel.from_pretrained(_tiny_base(), str(path)).eval()
        assert peft_model.peft_config["default"].r == r
        if targets is not None:
            assert set(peft_model.peft_config["default"].target_modules) == targets
        loaded = {k: v for k, v in peft_model.state_dict().items() if "lora_" in k}
        assert len(loaded) == len(saved)  # every saved tensor found its layer in the base
        for key, tensor in loaded.items():
            assert tensor.shape[0 if "lora_A" in key else 1] == r, key
        lora_b = [v for k, v in saved.items() if "lora_B" in k]
        assert lora_b and any(v.abs().sum() > 0 for v in lora_b)  # trained: B starts at zero
        for key, tensor in saved.items():
            name = key.replace(".weight", ".default.weight")
            assert torch.equal(peft_model.state_dict()[name], tensor), key
