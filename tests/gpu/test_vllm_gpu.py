"""VLLMSampler on a real vLLM engine (one CUDA GPU, ``pip install 'twinkle-hf[vllm]'``).

Run: ``python -m pytest tests/gpu/test_vllm_gpu.py -m gpu``. A tiny Qwen2 model (random weights, the
embedded tokenizer) is written to a directory both vLLM and a TransformersModel load; vLLM's sampled
log-probabilities must match TorchSampler's full forward of the same sequences (bf16 engine vs fp32
trainer: 0.05 per token), before and after syncing a LoRA adapter and full weights.

The engine is vLLM's default: V1 with the engine core in its own process and LoRA enabled, so the
full-weight sync crosses the process boundary (VLLMSampler sets VLLM_ALLOW_INSECURE_SERIALIZATION=1
before building it) and loads into the LoRA-wrapped ``.base_layer`` weights.
"""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the default multiprocess engine, as users run it

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (hardware)")]
#: Kept, not derived: the engine holds bf16 copies of the fp32 trainer's weights (each within U_BF16 = 2**-8,
#: tests/rounding.py) and rounds every op's output to bf16 in vLLM's own kernels, through every layer; no bound of
#: tests/rounding.py covers that path. A logprob z_y - lse(z) of this random model (logits |z| <~ 1) moves by at
#: most twice its largest logit's error, which one layer's bf16 rounding puts at ~LAMBDA_2 * U_BF16 |z| ~ 0.05.
#: It guards syncs that were not applied: a random rank-8 adapter and an SGD step at lr 5 move logprobs by more.
TOL = 0.05


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    pytest.importorskip("vllm", reason="needs the twinkle-hf[vllm] extra")
    from transformers import AutoModelForCausalLM, Qwen2Config

    from twinkle.model import TransformersModel
    from twinkle.template import Template
    from twinkle_hf.sampler import TorchSampler, VLLMSampler

    directory = tmp_path_factory.mktemp("tiny_qwen2")
    tokenizer = Template().tokenizer
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id, pad_token_id=0)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    model = TransformersModel(model_id=str(directory), mixed_precision="no")
    vllm_sampler = VLLMSampler(str(directory), dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=256,
                               enforce_eager=True, max_loras=2, max_lora_rank=8)
    return model, vllm_sampler, TorchSampler


def _check(vllm_sampler, torch_sampler, adapter):
    from twinkle.sampler import SamplingParams

    prompts = [[1, 20, 30, 40], [1, 50, 60]]
    results = vllm_sampler.sample(prompts, SamplingParams(max_tokens=8, n=2, seed=0, stop=[]), adapter_name=adapter)
    sequences = [r.prompt + s.tokens for r in results for s in r.sequences]
    expected = torch_sampler.compute_logprobs(sequences, adapter_name=adapter)
    got = [(r.prompt, s.logprobs) for r in results for s in r.sequences]
    for (prompt, sampled), full in zip(got, expected):
        assert len(sampled) == 8
        torch.testing.assert_close(torch.tensor(sampled), torch.tensor(full[len(prompt):]), rtol=0, atol=TOL)
    vllm_scored = vllm_sampler.compute_logprobs(sequences, adapter_name=adapter)
    for a, b in zip(vllm_scored, expected):
        torch.testing.assert_close(torch.tensor(a[1:]), torch.tensor(b[1:]), rtol=0, atol=TOL)


def test_vllm_samples_match_the_trainers_logprobs_and_follow_lora_and_full_syncs(setup):
    from peft import LoraConfig

    from twinkle_hf.sampler import TorchSampler

    model, vllm_sampler, _ = setup
    _check(vllm_sampler, TorchSampler(model), None)

    lora_model = type(model)(model_id=model.model_id, mixed_precision="no")
    torch.manual_seed(1)
    lora_model.add_adapter_to_model("policy", LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                         init_lora_weights=False))
    vllm_sampler.sync_weights(lora_model, adapter_name="policy")
    _check(vllm_sampler, TorchSampler(lora_model), "policy")

    model.set_optimizer("SGD", lr=5.0)
    model.forward_backward(inputs={"input_ids": torch.tensor([[1, 20, 30, 40, 50]]),
                                   "labels": torch.tensor([[1, 20, 30, 40, 50]])})
    model.clip_grad_and_step(max_grad_norm=1e9)
    vllm_sampler.sync_weights(model)
    assert os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"
    _check(vllm_sampler, TorchSampler(model), None)
