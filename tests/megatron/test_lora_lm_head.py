"""LoRA on megatron's output layer (HF ``lm_head``) against peft's LoRA on the HF model, untied and tied embeddings.

TP=1 here; TP=2 (vocabulary-parallel B with padded rows) is in ``scripts/tp2_checks.py`` /
``test_tensor_parallel.py``. References: ``PeftModel.from_pretrained`` of the saved adapter (logits, fp32,
a forward's bound) and peft's gradients of the same summed next-token loss (a step's bound, relative to the
largest entry as rounding.within scales it; a fused layer's shared A against the sum of peft's A gradients of
its projections): the same sums in another order, 4 rows of 12 tokens (tests/rounding.py).
"""

from __future__ import annotations

import shutil

import pytest
import torch
from megatron_testing import (
    ALL_LINEAR,
    adapter_grads,
    grad_diffs,
    hf_model,
    make_batch,
    megatron_model,
    peft_grads,
    save_hf,
    shared_a_adapter,
)
from peft import LoraConfig, PeftModel
from rounding import LORA_TERMS, chain_bound, tiny_hf, within
from safetensors.torch import load_file, save_file

from twinkle.checkpoint import CheckpointError
from twinkle_megatron.lora.inject import target_suffixes
from twinkle_megatron.lora.layer import LoraOutputLayer, LoraParallelLinear

pytestmark = pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True` and a tied layer:UserWarning")

FWD = tiny_hf(12, 4, vocab=125, extra=LORA_TERMS).forward_bound()
GRAD_RTOL = tiny_hf(12, 4, vocab=125, extra=LORA_TERMS).step_bound() * (1 + 128**0.5)  # rtol + within's atol
LM_HEAD = "base_model.model.lm_head"


@pytest.fixture(scope="module", params=[False, True], ids=["untied", "tied"])
def base(request, tmp_path_factory):
    tied = request.param
    return tied, save_hf(hf_model("qwen2", tie_word_embeddings=tied), tmp_path_factory.mktemp("lm_head") / "hf")


def _hf(tied):
    return hf_model("qwen2", tie_word_embeddings=tied)


def _logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def _randomise(model, adapter, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.gpt.modules():
            if isinstance(module, LoraParallelLinear) and adapter in module.lora_B:
                module.lora_B[adapter].copy_(0.1 * torch.randn(module.lora_B[adapter].shape, generator=gen))


def test_lm_head_maps_to_the_output_layer_and_all_linear_leaves_it_out():
    assert target_suffixes(LoraConfig(target_modules=["lm_head"])) == ["output_layer"]
    assert target_suffixes(LoraConfig(target_modules=["output_layer", "o_proj"])) == [
        "self_attention.linear_proj", "output_layer"]
    assert "output_layer" not in target_suffixes(LoraConfig(target_modules="all-linear"))  # as in peft


def test_lm_head_lora_gives_pefts_logits_and_gradients(base, tmp_path):
    tied, path = base
    model = megatron_model(path)
    model.add_adapter_to_model("all", LoraConfig(r=4, lora_alpha=8, target_modules=ALL_LINEAR + ["lm_head"]))
    model.add_adapter_to_model("head", LoraConfig(r=3, lora_alpha=12, use_rslora=True, target_modules=["lm_head"]))
    layer = model.gpt.output_layer
    assert isinstance(layer, LoraOutputLayer) and set(layer.lora_A) == {"all", "head"}
    assert (layer.base_layer.weight is None) == tied  # tied: the embedding weight comes in as weight=
    batch = make_batch(seed=3)
    real = batch["attention_mask"].bool()
    base_logits = _logits(_hf(tied), batch)
    for seed, adapter in enumerate(("all", "head")):
        _randomise(model, adapter, seed=10 + seed)
        saved = model.save(adapter, output_dir=str(tmp_path), adapter_name=adapter)
        tensors = load_file(f"{saved}/adapter_model.safetensors")
        assert tensors[f"{LM_HEAD}.lora_A.weight"].shape == (layer.r[adapter], 64)
        assert tensors[f"{LM_HEAD}.lora_B.weight"].shape == (125, layer.r[adapter])
        assert not any("base_layer" in k for k in tensors)

        peft_model = PeftModel.from_pretrained(_hf(tied), saved, is_trainable=True).eval()
        ours = model.forward_only(inputs=batch, adapter_name=adapter)["logits"]
        ref = _logits(peft_model, batch)
        torch.testing.assert_close(ours[real], ref[real], **within(FWD, ref[real]))
        assert (ref - base_logits)[real].abs().max() > 1e-3  # the adapter (for 'head': lm_head alone) does something

        model.set_optimizer("default", lr=1e-3, adapter_name=adapter)
        model.forward_backward(inputs=batch, adapter_name=adapter)
        diffs = grad_diffs(adapter_grads(model, adapter), peft_grads(peft_model, batch))
        assert {f"{LM_HEAD}.lora_A.weight", f"{LM_HEAD}.lora_B.weight"} <= set(diffs)
        logits_diff = float((ours[real] - ref[real]).abs().max())
        print(f"{'tied' if tied else 'untied'} {adapter}: logits diff {logits_diff:.1e}, "
              f"gradient rel diff {max(diffs.values()):.1e}")
        assert max(diffs.values()) <= GRAD_RTOL, max(diffs.items(), key=lambda kv: kv[1])
        model.zero_grad(adapter_name=adapter)


def test_the_output_layer_is_called_with_its_own_keywords(base):
    """GPTModel calls ``output_layer(hidden, weight=..., runtime_gather_output=...)``: the wrapper passes them on
    (at TP=1 a gathered output is the output) and adds the delta either way."""
    tied, path = base
    model = megatron_model(path)
    model.add_adapter_to_model("a", LoraConfig(r=2, target_modules=["lm_head"]))
    _randomise(model, "a", seed=1)
    layer, hidden = model.gpt.output_layer, torch.randn(5, 2, 64)
    assert layer.weight is layer.base_layer.weight  # GPTModel reads output_layer.weight (a last pipeline stage)
    shared = model.gpt.embedding.word_embeddings.weight if tied else None  # what GPTModel passes as weight=
    with torch.no_grad():
        plain, _ = layer(hidden, weight=shared)
        gathered, _ = layer(hidden, weight=shared, runtime_gather_output=True)
        alone, _ = layer.base_layer(hidden, weight=shared)
    weight = shared if tied else layer.weight
    assert torch.equal(plain, gathered)
    expected = hidden @ weight.t() + (hidden @ layer.lora_A["a"].t() @ layer.lora_B["a"].t()) * layer.scaling["a"]
    # one layer: 64 hidden terms, then r: float32's bound of that chain (tests/rounding.py)
    torch.testing.assert_close(plain, expected, **within(chain_bound(64, 2), expected, terms=64))
    assert (plain - alone).abs().max() > 1e-3


def test_a_peft_saved_lm_head_adapter_loads_into_megatron(base, tmp_path):
    """peft's save_pretrained adds the base lm_head weight to a LoRA on it; it is checked against the model's and
    dropped. A copy that differs is refused and the model is left as it was."""
    tied, path = base
    source = shared_a_adapter(tmp_path / "peft", lm_head=True, tie_word_embeddings=tied)
    written = load_file(str(source / "adapter_model.safetensors"))
    assert f"{LM_HEAD}.base_layer.weight" in written

    model = megatron_model(path)
    model.add_adapter_to_model("p", str(source))
    batch = make_batch(seed=4)
    real = batch["attention_mask"].bool()
    ours = model.forward_only(inputs=batch, adapter_name="p")["logits"]
    ref = _logits(PeftModel.from_pretrained(_hf(tied), str(source)).eval(), batch)[real]
    torch.testing.assert_close(ours[real], ref, **within(FWD, ref))
    again = load_file(f"{model.save('again', output_dir=str(tmp_path), adapter_name='p')}/adapter_model.safetensors")
    assert set(again) == set(written) - {f"{LM_HEAD}.base_layer.weight"}
    assert all(torch.equal(again[k], written[k]) for k in again)

    changed = tmp_path / "changed"
    shutil.copytree(source, changed)
    written[f"{LM_HEAD}.base_layer.weight"][0, 0] += 1.0
    save_file(written, str(changed / "adapter_model.safetensors"))
    with pytest.raises(CheckpointError, match=r"lm_head weight .* differs from this model's"):
        model.add_adapter_to_model("q", str(changed))
    assert set(model.gpt.output_layer.lora_A) == {"p"} and "q" not in model.optimizer_group
    assert torch.equal(model.forward_only(inputs=batch, adapter_name="p")["logits"], ours)


def test_the_wrapped_output_layer_keeps_megatrons_sharded_state_names(base):
    """GPTModel's sharded_state_dict (dist-checkpointing of the optimizer on GPU) looks up ``output_layer.weight``."""
    tied, path = base
    model = megatron_model(path)
    model.add_adapter_to_model("a", LoraConfig(r=2, target_modules=["lm_head"]))
    keys = {k for k in model.gpt.sharded_state_dict() if k.startswith("output_layer.")}
    assert keys == {"output_layer.lora_A.a", "output_layer.lora_B.a"} | (set() if tied else {"output_layer.weight"})
