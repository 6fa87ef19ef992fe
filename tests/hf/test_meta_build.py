"""Building on the meta device for FSDP2's sharded load, with ``strict_load``: a checkpoint holding tensors
the model has no place for is not read shard by shard (which would drop them silently) but handed to the
plain load, whose strict check names them."""

from __future__ import annotations

import pytest
import torch
from hf_testing import tiny_config
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from twinkle_hf.model.loading import load_hf_model
from twinkle_hf.model.meta import build_on_meta, on_meta


@pytest.fixture(scope="module")
def with_extra(tmp_path_factory):
    """A saved tiny Qwen2 whose safetensors file also holds one tensor the architecture does not have."""
    directory = tmp_path_factory.mktemp("extra")
    AutoModelForCausalLM.from_config(tiny_config()).save_pretrained(str(directory))
    state = load_file(str(directory / "model.safetensors"))
    save_file({**state, "model.extra_head.weight": torch.zeros(2, 2)}, str(directory / "model.safetensors"),
              metadata={"format": "pt"})
    return directory


def test_a_lenient_meta_build_reads_it_and_a_strict_one_hands_it_to_the_checked_load(with_extra):
    model, why = build_on_meta(AutoModelForCausalLM, str(with_extra), None, {})
    assert model is not None and why == "" and on_meta(model)
    model, why = build_on_meta(AutoModelForCausalLM, str(with_extra), None, {}, strict=True)
    assert model is None and "1 stored tensors are not the model's" in why and "model.extra_head.weight" in why
    with pytest.raises(ValueError, match=r"1 unexpected .*model.extra_head.weight.*strict_load=False"):
        load_hf_model(AutoModelForCausalLM, str(with_extra), None, {}, strict=True)
