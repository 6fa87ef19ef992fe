"""VLLMSampler without vLLM: the import guard, request building, output parsing and weight sync against a fake engine.

The fake engine records what the sampler sends and answers with objects shaped like vLLM's
``RequestOutput`` / ``CompletionOutput`` / ``Logprob``. The real engine runs in tests/gpu/test_vllm_gpu.py.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import fake_vllm
import pytest
import torch
from hf_testing import make_model, tiny_config
from peft import LoraConfig, PeftConfig
from safetensors.torch import load_file

from twinkle.registry import resolve
from twinkle.sampler import SamplingParams
from twinkle_hf.sampler import VLLMSampler
from twinkle_hf.sampler.vllm_sampler import lora_base_layer_names, parse_completion, sampling_kwargs


class FakeApi:
    def __init__(self) -> None:
        self.built = None

    def llm(self, **kwargs):
        self.built = kwargs
        return FakeEngine()

    def sampling_params(self, **kwargs):
        return SimpleNamespace(kind="params", **kwargs)

    def lora_request(self, name, lora_id, path):
        return SimpleNamespace(lora_name=name, lora_int_id=lora_id, lora_path=path)


def _logprob(value):
    return SimpleNamespace(logprob=value)


class FakeEngine:
    """Answers every prompt with ``n`` completions: token ids prompt[-1]+1.., logprob -0.5 * (k + 1)."""

    def __init__(self) -> None:
        self.calls, self.applied, self.removed, self.resets = [], [], [], 0
        self.llm_engine = SimpleNamespace(remove_lora=self.removed.append)

    def generate(self, prompts, sampling_params=None, lora_request=None, use_tqdm=True):
        self.calls.append(dict(prompts=prompts, params=sampling_params, lora=lora_request))
        outputs = []
        for prompt in prompts:
            ids = prompt["prompt_token_ids"]
            if getattr(sampling_params, "prompt_logprobs", None) is not None:
                prompt_lp = [None] + [{t: _logprob(-0.1 * i), t + 1: _logprob(-9.0)} for i, t in enumerate(ids) if i]
                outputs.append(SimpleNamespace(prompt_logprobs=prompt_lp, outputs=[]))
                continue
            completions = []
            for j in range(sampling_params.n):
                tokens = [ids[-1] + 1 + j + k for k in range(3)]
                completions.append(SimpleNamespace(
                    token_ids=tokens, text=f"sample{j}", finish_reason="stop" if j == 0 else "length",
                    logprobs=[{t: _logprob(-0.5 * (k + 1)), 0: _logprob(-7.0)} for k, t in enumerate(tokens)]))
            outputs.append(SimpleNamespace(prompt_logprobs=None, outputs=completions))
        return outputs

    def apply_model(self, fn):
        model = torch.nn.Module()  # a vLLM model is a torch module (here without LoRA-wrapped layers)
        model.loaded = []
        model.load_weights = lambda weights: model.loaded.extend(weights)
        fn(model)
        self.applied.append(model.loaded)

    def reset_prefix_cache(self):
        self.resets += 1


@pytest.fixture(autouse=True)
def vllm_environment(monkeypatch):
    """vLLM's defaults (multiprocess engine, no pickling); whatever a sampler sets is undone afterwards."""
    for var in (fake_vllm.INSECURE, "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.setenv(var, "")  # recorded as absent before: removed again at teardown
        monkeypatch.delenv(var)


@pytest.fixture
def sampler(tmp_path):
    return VLLMSampler("some/model", api=FakeApi(), adapter_dir=str(tmp_path / "adapters"), gpu_memory_utilization=0.3)


def test_sampling_params_map_to_vllms():
    kwargs = sampling_kwargs(SamplingParams(max_tokens=7, temperature=0.6, top_p=0.9, top_k=40, n=3, seed=5))
    assert kwargs == dict(n=3, max_tokens=7, temperature=0.6, top_p=0.9, top_k=40, seed=5, logprobs=0)
    assert sampling_kwargs(SamplingParams())["top_k"] == -1  # no limit
    explicit = sampling_kwargs(SamplingParams(stop=["</answer>", 2, "\n\n"]))
    assert explicit["stop"] == ["</answer>", "\n\n"] and explicit["stop_token_ids"] == [2] and explicit["ignore_eos"]
    assert sampling_kwargs(SamplingParams(stop=[]))["ignore_eos"] is True  # never stop before max_tokens


def test_sample_builds_token_prompts_and_per_prompt_lora_requests(sampler, tmp_path):
    adapter = tmp_path / "tenant"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    sampler.sync_adapter("t1", adapter)
    results = sampler.sample([[1, 2], [7]], SamplingParams(n=2, max_tokens=3, seed=1), adapter_name=["t1", None])
    assert sampler.api.built["model"] == "some/model" and sampler.api.built["enable_lora"]
    assert sampler.api.built["gpu_memory_utilization"] == 0.3
    call = sampler.engine.calls[-1]
    assert call["prompts"] == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [7]}]
    assert call["lora"][0].lora_name == "t1" and call["lora"][0].lora_path == str(adapter) and call["lora"][1] is None
    assert call["params"].n == 2 and call["params"].logprobs == 0 and call["params"].seed == 1
    first = results[0].sequences[0]
    assert first.tokens == [3, 4, 5] and first.logprobs == [-0.5, -1.0, -1.5] and first.stop_reason == "stop"
    assert results[0].sequences[1].stop_reason == "length" and results[1].adapter_name is None


def test_compute_logprobs_reads_prompt_logprobs_of_the_given_tokens(sampler):
    values = sampler.compute_logprobs([[4, 5, 6]], reference=True)
    assert values == [[None, -0.1, -0.2]]  # the engine's Python floats passed through: exact
    call = sampler.engine.calls[-1]
    assert call["params"].prompt_logprobs == 0 and call["lora"] == [None]


def test_lora_weights_sync_as_new_adapter_versions(sampler):
    model = make_model(seed=0)
    model.add_adapter_to_model("policy", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                    init_lora_weights=False))
    model.set_optimizer("SGD", lr=0.5, adapter_name="policy")
    sampler.sync_weights(model, adapter_name="policy")
    first = sampler.adapters["policy"]
    batch = {"input_ids": torch.tensor([[3, 4, 5, 6]]), "labels": torch.tensor([[3, 4, 5, 6]])}
    model.forward_backward(inputs=batch, adapter_name="policy")
    model.clip_grad_and_step(adapter_name="policy")
    sampler.sync_weights(model, adapter_name="policy")
    second = sampler.adapters["policy"]
    assert second.lora_id > first.lora_id and sampler.engine.removed == [first.lora_id]
    assert not Path(first.path).exists()  # the superseded version's files are gone
    config = PeftConfig.from_pretrained(second.path)
    assert config.r == 4 and set(config.target_modules) == {"q_proj", "v_proj"}
    saved = load_file(str(Path(second.path) / "adapter_model.safetensors"))
    current = model.get_state_dict(adapter_name="policy")
    assert saved and len(saved) == len(current)
    for (_, a), (_, b) in zip(sorted(saved.items()), sorted(current.items())):
        assert a.dtype == b.dtype and torch.equal(a, b.cpu())  # the float32 tensors written and read back: exact
    sampler.sample([[1]], adapter_name="policy")
    assert sampler.engine.calls[-1]["lora"][0].lora_int_id == second.lora_id


def test_full_weights_sync_in_memory(sampler):
    model = make_model(seed=1)
    sampler.sync_weights(model)
    loaded = dict(sampler.engine.applied[-1])
    state = model.get_state_dict()
    assert loaded.keys() == state.keys() and sampler.engine.resets == 1
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor)


def test_multi_lora_tenant_syncs_as_its_own_adapter(sampler):
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multi_lora"))
    from ml_testing import lora, make_multi

    multi = make_multi(seed=0, max_loras=2, max_r=8)
    multi.multi_lora.acquire_lora("alice", lora(r=2, alpha=4))
    sampler.sync_weights(multi, adapter_name="alice")
    path = Path(sampler.adapters["alice"].path)
    assert PeftConfig.from_pretrained(str(path)).r == 2
    assert set(load_file(str(path / "adapter_model.safetensors"))) == set(multi.get_state_dict(adapter_name="alice"))


def test_errors_say_what_to_do(sampler, tmp_path):
    with pytest.raises(KeyError, match="sync_weights"):
        sampler.sample([[1, 2]], adapter_name="nobody")
    with pytest.raises(FileNotFoundError, match="adapter_config.json"):
        sampler.sync_adapter("x", tmp_path)
    with pytest.raises(ValueError, match="model_id"):
        VLLMSampler()
    bad = SimpleNamespace(token_ids=[1, 2], logprobs=None, finish_reason="stop")
    with pytest.raises(RuntimeError, match="logprobs=0"):
        parse_completion(bad)


def test_prompts_beyond_the_engines_vocabulary_or_context_are_refused(sampler):
    config = SimpleNamespace(max_model_len=32, get_vocab_size=lambda: 100)
    sampler.engine.llm_engine.model_config = config  # what vllm.LLM reports (llm_engine.model_config)
    with pytest.raises(ValueError, match=r"prompts\[1\] holds token id 100 at position 0, outside the model's "
                                         r"vocabulary \(ids 0..99\)"):
        sampler.sample([[1, 2], [100]])
    with pytest.raises(ValueError, match=r"prompts\[0\] needs 34 positions \(26 tokens \+ max_tokens 8\) but the "
                                         r"model has 32 \(the engine's max_model_len\)"):
        sampler.sample([[1] * 26], SamplingParams(max_tokens=8))
    with pytest.raises(ValueError, match=r"sequences\[0\] needs 33 positions"):
        sampler.compute_logprobs([[1] * 33])
    assert sampler.engine.calls == []  # nothing reached the engine


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_without_vllm_the_engine_names_the_extra():
    with pytest.raises(ImportError, match=r"twinkle-hf\[vllm\]"):
        _ = VLLMSampler("some/model").engine


def test_registered_by_name():
    assert resolve("sampler", "VLLMSampler") is VLLMSampler


# ------------------------------------------------------- full weights into the default (LoRA, multiprocess) engine
def _expected_vllm_weights(model) -> dict[str, torch.Tensor]:
    """The trainer's HF weights laid out as vLLM's Qwen2 holds them (q/k/v and gate/up packed)."""
    state = model.get_state_dict()
    expected = {}
    for name, tensor in state.items():
        if ".q_proj." in name:
            parts = [state[name.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
            expected[name.replace("q_proj", "qkv_proj")] = torch.cat(parts)
        elif ".gate_proj." in name:
            expected[name.replace("gate_proj", "gate_up_proj")] = torch.cat([tensor, state[name.replace("gate", "up")]])
        elif not any(f".{p}." in name for p in ("k_proj", "v_proj", "up_proj")):
            expected[name] = tensor
    return expected


def _held(vllm_model) -> dict[str, torch.Tensor]:
    return {n.replace(".base_layer", ""): p.detach() for n, p in vllm_model.named_parameters()}


@pytest.mark.parametrize("lora", [True, False], ids=["enable_lora", "no_lora"])
def test_full_weights_reach_the_default_vllm_engine(tmp_path, lora):
    """Issue 22, defect 6: with enable_lora=True (the default) vLLM holds q/k/v as qkv_proj.base_layer.weight,
    and under the V1 multiprocess engine apply_model pickles the callback (VLLM_ALLOW_INSECURE_SERIALIZATION)."""
    model = make_model(seed=2)
    api = fake_vllm.Api(tiny_config("qwen2"))
    sampler = VLLMSampler("some/model", api=api, adapter_dir=str(tmp_path), enable_lora=lora)
    sampler.sync_weights(model)
    assert os.environ[fake_vllm.INSECURE] == "1"  # set before the engine (its process) was built
    held, expected = _held(sampler.engine.model), _expected_vllm_weights(model)
    assert held.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(held[name], tensor), name
    assert sampler.engine.resets == 1
    wrapped = [n for n, _ in sampler.engine.model.named_parameters() if ".base_layer." in n]
    assert bool(wrapped) is lora


def test_a_given_multiprocess_engine_without_pickling_allowed_is_refused_with_what_to_do(tmp_path):
    engine = fake_vllm.Api(tiny_config("qwen2")).llm(enable_lora=True)  # built by the user, variable unset
    sampler = VLLMSampler(engine=engine, adapter_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match="VLLM_ALLOW_INSECURE_SERIALIZATION=1 .* VLLM_ENABLE_V1_MULTIPROCESSING=0"):
        sampler.sync_weights(make_model(seed=2))
    assert fake_vllm.INSECURE not in os.environ  # a user's engine: the sampler does not change the environment


def test_names_follow_the_models_weight_mapper():
    """A model whose loader strips a prefix (vLLM's hf_to_vllm_mapper) still gets base_layer names."""

    class Mapper:
        def apply(self, weights):
            return ((name.removeprefix("model."), data) for name, data in weights)

    vllm_model = fake_vllm.VllmQwen2(tiny_config("qwen2", num_hidden_layers=1), lora=True)
    vllm_model.hf_to_vllm_mapper = Mapper()
    names = [n for n, _ in lora_base_layer_names(vllm_model, [(n, None) for n in (
        "model.layers.0.self_attn.k_proj.bias", "model.layers.0.mlp.down_proj.weight", "model.norm.weight",
        "model.embed_tokens.weight", "lm_head.weight")])]
    assert names == ["model.layers.0.self_attn.k_proj.base_layer.bias",
                     "model.layers.0.mlp.down_proj.base_layer.weight",
                     "model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"]
