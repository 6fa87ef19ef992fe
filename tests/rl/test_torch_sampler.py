"""TorchSampler on a TransformersModel: logprobs equal a full forward, seeds, stops, adapters, reference, state."""

from __future__ import annotations

import pytest
import torch
from hf_testing import make_model, tiny_config
from peft import LoraConfig
from rounding import LORA_TERMS, chain_bound, tiny_hf, within
from transformers import AutoModelForCausalLM

from twinkle.registry import resolve
from twinkle.sampler import SamplingParams
from twinkle_hf.sampler import TorchSampler

#: the tiny model with a LoRA, sequences of at most 16 tokens, a few at once: float32's forward bound for another
#: summation order (tests/rounding.py), elementwise as rounding.within scales it
FWD = tiny_hf(16, 8, extra=LORA_TERMS).forward_bound()

PROMPTS = [[5, 6, 7], [8, 9, 10, 11, 12], [13]]


@pytest.fixture(scope="module")
def lora_model():
    model = make_model(seed=0)
    torch.manual_seed(1)
    for name in ("a", "b"):
        model.add_adapter_to_model(name, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"],
                                                    init_lora_weights=False))
    return model


def _full_forward_logprobs(module: torch.nn.Module, sequence: list[int]) -> list[float]:
    """log p(token_i | tokens_<i) from one plain forward of one unpadded sequence (no twinkle code)."""
    with torch.no_grad():
        logits = module(input_ids=torch.tensor([sequence])).logits[0].double()
    return torch.log_softmax(logits, -1)[torch.arange(len(sequence) - 1), torch.tensor(sequence[1:])].tolist()


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=6, n=3, seed=1, stop=[]),
    SamplingParams(max_tokens=5, n=2, seed=2, temperature=0.7, top_k=20, top_p=0.9, stop=[]),
    SamplingParams(max_tokens=4, temperature=0, stop=[]),
], ids=["plain", "filtered", "greedy"])
def test_sampled_logprobs_equal_a_full_forward(lora_model, params):
    sampler = TorchSampler(lora_model)
    results = sampler.sample(PROMPTS, params, adapter_name="a")
    lora_model.model.set_adapter("a")
    scored = sampler.compute_logprobs([r.prompt + s.tokens for r in results for s in r.sequences], adapter_name="a")
    k = 0
    for result in results:
        assert result.adapter_name == "a" and len(result.sequences) == params.n
        for seq in result.sequences:
            assert len(seq.tokens) == params.max_tokens and seq.stop_reason == "length"
            full = _full_forward_logprobs(lora_model.model, result.prompt + seq.tokens)
            assert scored[k][0] is None
            full = torch.tensor(full, dtype=torch.float64)
            # the incremental (KV-cache) and the batched forwards sum in other orders: a forward's float32 bound
            torch.testing.assert_close(torch.tensor(scored[k][1:], dtype=torch.float64), full, **within(FWD, full))
            torch.testing.assert_close(torch.tensor(seq.logprobs, dtype=torch.float64),
                                       full[len(result.prompt) - 1:], **within(FWD, full))
            k += 1


def test_greedy_picks_the_argmax_of_the_adapters_distribution(lora_model):
    sampler = TorchSampler(lora_model)
    for adapter in ("a", "b"):
        got = sampler.sample([PROMPTS[1]], SamplingParams(max_tokens=5, temperature=0, stop=[]), adapter_name=adapter)
        sequence = list(PROMPTS[1])
        lora_model.model.set_adapter(adapter)
        for _ in range(5):
            with torch.no_grad():
                sequence.append(int(lora_model.model(input_ids=torch.tensor([sequence])).logits[0, -1].argmax()))
        assert got[0].sequences[0].tokens == sequence[len(PROMPTS[1]):], adapter


def test_same_seed_same_samples_and_other_seed_differs(lora_model):
    sampler = TorchSampler(lora_model)
    params = SamplingParams(max_tokens=6, n=2, seed=11, stop=[])
    first = [s.tokens for r in sampler.sample(PROMPTS, params, adapter_name="b") for s in r.sequences]
    torch.manual_seed(123)  # the global RNG does not matter with a seed
    again = [s.tokens for r in sampler.sample(PROMPTS, params, adapter_name="b") for s in r.sequences]
    other = [s.tokens for r in sampler.sample(PROMPTS, SamplingParams(max_tokens=6, n=2, seed=12, stop=[]),
                                               adapter_name="b") for s in r.sequences]
    assert first == again and first != other


def test_stop_token_ends_the_sample_with_the_same_prefix(lora_model):
    sampler = TorchSampler(lora_model)
    free = sampler.sample([PROMPTS[0]], SamplingParams(max_tokens=8, seed=5, stop=[]), adapter_name="a")[0].sequences[0]
    stop_token = free.tokens[3]
    cut = free.tokens.index(stop_token) + 1
    stopped = sampler.sample([PROMPTS[0]], SamplingParams(max_tokens=8, seed=5, stop=[stop_token]),
                             adapter_name="a")[0].sequences[0]
    assert stopped.tokens == free.tokens[:cut] and stopped.stop_reason == "stop"
    # the same seeded steps until the stop: the same shapes and operations, so the same floats
    assert stopped.logprobs == free.logprobs[:cut]


def test_default_stop_is_the_models_eos(lora_model):
    sampler = TorchSampler(lora_model)
    free = sampler.sample([PROMPTS[2]], SamplingParams(max_tokens=8, seed=9, stop=[]), adapter_name="a")[0]
    eos = free.sequences[0].tokens[2]
    config = lora_model.backend.hf_model().config
    previous, config.eos_token_id = config.eos_token_id, eos
    try:
        ended = sampler.sample([PROMPTS[2]], SamplingParams(max_tokens=8, seed=9), adapter_name="a")[0]
    finally:
        config.eos_token_id = previous
    assert ended.sequences[0].tokens[-1] == eos and ended.sequences[0].stop_reason == "stop"
    assert len(ended.sequences[0].tokens) == free.sequences[0].tokens.index(eos) + 1


def test_stop_strings_with_the_templates_tokenizer():
    from twinkle.template import Template

    template = Template()
    torch.manual_seed(0)
    model = make_model(config=tiny_config(vocab_size=len(template.tokenizer)))
    sampler = TorchSampler(model, tokenizer=template.tokenizer)
    prompt = template.encode_prompt([{"role": "user", "content": "hi"}])
    free = sampler.sample([prompt], SamplingParams(max_tokens=10, seed=4, stop=[]))[0].sequences[0]
    text = free.text
    stop = text[len(text) // 2:len(text) // 2 + 2].strip() or text[-1]
    stopped = sampler.sample([prompt], SamplingParams(max_tokens=10, seed=4, stop=stop))[0].sequences[0]
    assert stop in stopped.text and stop not in template.tokenizer.decode(stopped.tokens[:-1])
    assert stopped.tokens == free.tokens[:len(stopped.tokens)] and stopped.stop_reason == "stop"
    with pytest.raises(ValueError, match="tokenizer"):
        TorchSampler(make_model()).sample([[1, 2]], SamplingParams(stop="x"))


def test_text_is_decoded_when_read_and_travels_by_pickle():
    import pickle

    from twinkle.template import Template

    template = Template()
    calls = []

    class Counting:
        def decode(self, tokens, **kwargs):
            calls.append(list(tokens))
            return template.tokenizer.decode(tokens, **kwargs)

    torch.manual_seed(0)
    sampler = TorchSampler(make_model(config=tiny_config(vocab_size=len(template.tokenizer))), tokenizer=Counting())
    result = sampler.sample([[5, 6, 7]], SamplingParams(max_tokens=4, n=2, seed=1, stop=[]))[0]
    assert calls == []  # sampling itself decodes nothing
    first = result.sequences[0]
    assert first.text == template.tokenizer.decode(first.tokens) and calls == [first.tokens]
    assert first.text and len(calls) == 1  # decoded once
    again = pickle.loads(pickle.dumps(result.sequences[1]))
    assert again.text == template.tokenizer.decode(again.tokens) and again == result.sequences[1]


def test_sampled_logprobs_stay_exact_for_improbable_tokens():
    from twinkle_hf.sampler.torch_sampler import sampled_logprobs

    steps = [torch.tensor([[0.0, 200.0, -10.0], [1.0, 2.0, 3.0]]), torch.tensor([[5.0, 5.0, 5.0], [0.0, -300.0, 0.0]])]
    tokens = torch.tensor([[0, 2], [2, 1]])  # row 0 step 0 and row 1 step 1: probabilities far below float32's range
    expected = torch.stack([torch.log_softmax(step.double(), -1).gather(-1, tokens[:, k:k + 1]).squeeze(1)
                            for k, step in enumerate(steps)], 1)
    got = sampled_logprobs(steps, tokens)
    assert torch.isfinite(got).all()
    # float32 log-softmax of 3 logits against float64's: a few roundings, each u of the logits' size (<= 300), at most
    # ~3 u 300 = 5e-5 where the logprob is ~-300 (rtol covers 3.7e-4 there) and u |logprob| elsewhere (atol 1e-5)
    torch.testing.assert_close(got.double(), expected, rtol=chain_bound(3), atol=1e-5)


def test_reference_logprobs_are_the_base_models(lora_model):
    base = AutoModelForCausalLM.from_config(tiny_config())
    state = {k.replace("base_model.model.", "").replace(".base_layer", ""): v
             for k, v in lora_model.model.state_dict().items() if "lora_" not in k}
    base.load_state_dict(state)
    sequence = [4, 9, 2, 7, 30, 31]
    got = TorchSampler(lora_model).compute_logprobs([sequence], adapter_name="a", reference=True)[0]
    expected = torch.tensor(_full_forward_logprobs(base, sequence), dtype=torch.float64)
    torch.testing.assert_close(torch.tensor(got[1:], dtype=torch.float64), expected, **within(FWD, expected))
    with_adapter = TorchSampler(lora_model).compute_logprobs([sequence], adapter_name="a")[0]
    assert max(abs(x - y) for x, y in zip(got[1:], with_adapter[1:])) > 1e-3


def test_sampling_leaves_the_training_state_alone(lora_model):
    lora_model.set_optimizer("SGD", lr=0.1, adapter_name="a")
    lora_model.model.train(True)
    frozen = lora_model.model.base_model.model.model.norm
    frozen.eval()  # a submodule a user keeps in eval mode stays there
    modes = {name: m.training for name, m in lora_model.model.named_modules()}
    seen = []
    hook = lora_model.model.base_model.model.model.layers[0].register_forward_hook(
        lambda module, args, out: seen.append(module.training))
    group = lora_model.optimizer_group["a"]
    before = (group.micro_step, group.total_micro_steps, group.cur_step)
    try:
        TorchSampler(lora_model).sample(PROMPTS, SamplingParams(max_tokens=3, stop=[]), adapter_name="a")
    finally:
        hook.remove()
    assert seen and not any(seen)  # generated in eval mode
    assert {name: m.training for name, m in lora_model.model.named_modules()} == modes
    lora_model.model.train(True)
    assert lora_model.model.training and (group.micro_step, group.total_micro_steps, group.cur_step) == before
    assert all(p.grad is None for p in lora_model.model.parameters())


def test_bad_requests_are_refused_with_the_fix(lora_model):
    sampler = TorchSampler(lora_model)
    with pytest.raises(ValueError, match="adapters"):
        sampler.sample(PROMPTS, SamplingParams(max_tokens=2))  # two adapters: name one
    with pytest.raises(KeyError, match="No adapter named 'zz'"):
        sampler.sample(PROMPTS, adapter_name="zz")
    with pytest.raises(ValueError, match="one per prompt"):
        sampler.sample(PROMPTS, adapter_name=["a", "b"])
    with pytest.raises(TypeError, match="token ids"):
        sampler.sample(["hello"], adapter_name="a")
    for bad in (dict(max_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_k=-5), dict(stop=[""])):
        with pytest.raises(ValueError, match="SamplingParams"):
            SamplingParams(**bad)
    with pytest.raises(TypeError, match="TransformersModel"):
        TorchSampler(object())
    with pytest.raises(ValueError, match="full model"):
        TorchSampler(make_model()).compute_logprobs([[1, 2, 3]], reference=True)


def test_registered_by_name():
    assert resolve("sampler", "TorchSampler") is TorchSampler
