"""HF columns of the family matrix: each family's tiny model LoRA-trains on its own encoded conversations
through TransformersModel (loss falls), saves, and the adapter loads in plain transformers + peft with the
same logits (bitwise: the same operations in one process).

Measured reasons kept in the tests (docs/models.md):
- DeepSeek V4's grouped output projection (``o_a_proj``, ``DeepseekV4GroupedLinear``) is an ``nn.Linear``
  subclass whose forward reshapes its input per group; peft's LoRA layer wraps it as a plain linear and the
  forward fails on the shapes ("size of tensor a (16) must match ... (32)"), so ``all-linear`` excludes it.
- InternLM2.5 is remote code: TransformersModel needs ``trust_remote_code=True`` (which also reads its config).
"""

from __future__ import annotations

import pytest
import torch
from family_cases import cases
from family_testing import FAMILIES
from peft import LoraConfig, PeftModel
from transformers import AutoModelForCausalLM

import twinkle.template as templates
from twinkle.model import TransformersModel

STEPS = 3
LR = 5e-3


def lora_config(key: str) -> LoraConfig:
    exclude = ["o_a_proj"] if key == "deepseek_v4" else None
    return LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", exclude_modules=exclude)


def padded(rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(r["input_ids"]) for r in rows)
    ids = torch.tensor([r["input_ids"] + [0] * (n - len(r["input_ids"])) for r in rows])
    mask = torch.tensor([[1] * len(r["input_ids"]) + [0] * (n - len(r["input_ids"])) for r in rows])
    return ids, mask


@pytest.mark.parametrize("key", list(FAMILIES))
def test_family_lora_trains_saves_and_loads_in_peft(family_dirs, key, tmp_path):
    family, path = FAMILIES[key], str(family_dirs[key])
    remote_tokenizer = family.slow_tokenizer is not None
    template = getattr(templates, family.template)(model_id=path, trust_remote_code=remote_tokenizer)
    rows = [template.encode(case.row) for case in cases(key)]

    model = TransformersModel(model_id=path, mixed_precision="no", trust_remote_code=family.remote_model)
    assert type(model.model).__name__ == family.architecture
    model.add_adapter_to_model("sft", lora_config(key))
    model.set_optimizer("AdamW", lr=LR, adapter_name="sft")
    losses = []
    for _ in range(STEPS):
        losses.append(float(model.forward_backward(inputs=rows, adapter_name="sft")))
        model.clip_grad_and_step(adapter_name="sft")
    assert losses[-1] < losses[0] - 0.05, losses

    saved = model.save("sft", output_dir=str(tmp_path), adapter_name="sft")
    ours = model.forward_only(inputs=rows, adapter_name="sft")["logits"]
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, trust_remote_code=family.remote_model)
    assert type(base).__name__ == family.architecture
    peft_model = PeftModel.from_pretrained(base, saved).eval()
    ids, mask = padded(rows)
    with torch.no_grad():
        expected = peft_model(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    # one process, the same modules and weights (the adapter's float32 tensors saved and loaded exactly), the
    # same padded batch (forward_only pads the rows as padded() does): the same float32 operations, bitwise
    assert ours.shape == expected.shape
    assert torch.equal(ours[real], expected[real])


def test_deepseek_v4_grouped_projection_is_why_all_linear_excludes_it(family_dirs):
    """The measured reason above: with o_a_proj adapted, the forward fails on its grouped shapes."""
    path = str(family_dirs["deepseek_v4"])
    template = templates.DeepSeekV4Template(model_id=path)
    rows = [template.encode(cases("deepseek_v4")[1].row)]
    model = TransformersModel(model_id=path, mixed_precision="no")
    model.add_adapter_to_model("sft", LoraConfig(r=4, target_modules=["o_a_proj"]))
    with pytest.raises(RuntimeError, match="must match the size"):
        model.forward_only(inputs=rows, adapter_name="sft")
