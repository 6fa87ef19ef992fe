"""Multi-LoRA tenants: several sample in one batch, each as its own single-adapter model; RL steps per tenant."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from peft import LoraConfig, get_peft_model
from rounding import LORA_TERMS, tiny_hf, within

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "multi_lora"))
from ml_testing import lora, make_multi, randomize, reference_base  # noqa: E402

from twinkle.rollout import Rollout  # noqa: E402
from twinkle.sampler import SamplingParams  # noqa: E402
from twinkle_hf.multi_lora.tenant_io import tenant_state_dict  # noqa: E402
from twinkle_hf.sampler import TorchSampler  # noqa: E402

#: the tiny model with LoRA tenants, rows of at most 12 tokens (another summation order: a stacked batch, an
#: incremental sampler, a single-adapter model): float32's forward and step bounds (tests/rounding.py)
FWD = tiny_hf(12, 4, extra=LORA_TERMS).forward_bound()
STEP = tiny_hf(12, 4, extra=LORA_TERMS).step_bound()

TENANTS = {"t1": dict(r=4, alpha=8, targets=("q_proj", "v_proj")), "t2": dict(r=8, alpha=8, targets="all-linear")}


@pytest.fixture(scope="module")
def multi():
    model = make_multi(seed=0)
    for k, (name, spec) in enumerate(TENANTS.items()):
        model.multi_lora.acquire_lora(name, lora(**spec))
        randomize(model, name, seed=10 + k)
    return model


def _single_adapter_model(multi, tenant: str) -> torch.nn.Module:
    """A plain transformers + peft model holding only ``tenant``'s adapter (its saved r-rank weights)."""
    spec = TENANTS[tenant]
    config = LoraConfig(r=spec["r"], lora_alpha=spec["alpha"], target_modules=spec["targets"] if isinstance(
        spec["targets"], str) else list(spec["targets"]))
    model = get_peft_model(reference_base(multi), config)
    saved = tenant_state_dict(multi.slots, multi.slots.specs[multi.multi_lora.get(tenant).adapter_name])
    state = {k.replace(".weight", ".default.weight"): v for k, v in saved.items()}
    missing = model.load_state_dict(state, strict=False)
    assert not missing.unexpected_keys and not [k for k in missing.missing_keys if "lora_" in k]
    return model.eval()


def test_two_tenants_in_one_batch_each_equal_a_single_adapter_model(multi):
    sampler = TorchSampler(multi)
    prompts = [[5, 6, 7], [8, 9, 10, 11], [12, 13]]
    names = ["t2", "t1", "t2"]
    results = sampler.sample(prompts, SamplingParams(max_tokens=5, n=2, seed=3, stop=[]), adapter_name=names)
    greedy = sampler.sample(prompts, SamplingParams(max_tokens=5, temperature=0, stop=[]), adapter_name=names)
    for tenant in TENANTS:
        single = _single_adapter_model(multi, tenant)
        for result, greedy_result, name in zip(results, greedy, names):
            if name != tenant:
                continue
            assert result.adapter_name == tenant
            for seq in result.sequences:
                ids = torch.tensor([result.prompt + seq.tokens])
                with torch.no_grad():
                    logits = single(input_ids=ids).logits[0, len(result.prompt) - 1:-1].double()
                expected = torch.log_softmax(logits, -1)[torch.arange(len(seq.tokens)), torch.tensor(seq.tokens)]
                torch.testing.assert_close(torch.tensor(seq.logprobs, dtype=torch.float64), expected,
                                           **within(FWD, expected))
            with torch.no_grad():
                plain = single.generate(input_ids=torch.tensor([result.prompt]), max_new_tokens=5, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)
            assert greedy_result.sequences[0].tokens == plain[0, len(result.prompt):].tolist(), tenant


def test_tenant_logprobs_and_reference_in_one_call(multi):
    sampler = TorchSampler(multi)
    sequences = [[3, 4, 5, 6, 7], [8, 9, 10]]
    mixed = sampler.compute_logprobs(sequences, adapter_name=["t1", "t2"])
    alone = [sampler.compute_logprobs([s], adapter_name=t)[0] for s, t in zip(sequences, ["t1", "t2"])]
    for a, b in zip(mixed, alone):
        want = torch.tensor(b[1:], dtype=torch.float64)
        torch.testing.assert_close(torch.tensor(a[1:], dtype=torch.float64), want, **within(FWD, want))
    base = reference_base(multi)
    ref = sampler.compute_logprobs(sequences, adapter_name=["t1", "t2"], reference=True)
    for seq, values in zip(sequences, ref):
        with torch.no_grad():
            logits = base(input_ids=torch.tensor([seq])).logits[0, :-1].double()
        expected = torch.log_softmax(logits, -1)[torch.arange(len(seq) - 1), torch.tensor(seq[1:])]
        torch.testing.assert_close(torch.tensor(values[1:], dtype=torch.float64), expected, **within(FWD, expected))


def _rollouts(seed: int) -> list[Rollout]:
    gen = torch.Generator().manual_seed(seed)
    return [Rollout(torch.randint(3, 100, (p,), generator=gen).tolist(), torch.randint(3, 100, (c,), generator=gen)
                    .tolist(), (-torch.rand(c, generator=gen) * 4).tolist(), float(torch.randn(1, generator=gen)))
            for p, c in ((3, 4), (2, 6), (5, 2))]


def test_rl_step_of_several_tenants_at_once_equals_each_tenants_own(multi):
    """forward_backward_multi with GRPO (KL to the shared base) = each tenant's own forward_backward."""
    batches = {"t1": _rollouts(1), "t2": _rollouts(2)}
    for tenant in TENANTS:
        multi.set_loss("grpo", beta=0.1, adapter_name=tenant)
        multi.set_optimizer("SGD", lr=0.0, adapter_name=tenant)
    losses = multi.forward_backward_multi(batches)
    together = {t: [p.grad.clone() for p in multi.backend.parameters(multi._group(t))] for t in TENANTS}
    outputs = {t: multi.get_loss_outputs(adapter_name=t) for t in TENANTS}
    for t in TENANTS:
        multi.zero_grad(adapter_name=t)
    for tenant, batch in batches.items():
        alone = multi.forward_backward(inputs=batch, adapter_name=tenant)
        assert alone == pytest.approx(losses[tenant], rel=FWD)
        for got, want in zip(together[tenant], (p.grad for p in multi.backend.parameters(multi._group(tenant)))):
            torch.testing.assert_close(got, want, **within(STEP, want))
        own = multi.get_loss_outputs(adapter_name=tenant)
        assert len(own) == len(outputs[tenant]) == 3
        for a, b in zip(own, outputs[tenant]):
            torch.testing.assert_close(a["logprobs"], b["logprobs"], **within(FWD, b["logprobs"]))
        multi.zero_grad(adapter_name=tenant)
