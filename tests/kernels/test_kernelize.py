"""kernelize on CPU: the default chains change nothing and say so; custom chains apply and undo exactly."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F
from rounding import tiny_hf, within

from twinkle.kernel import (
    DEFAULT_KERNEL_CONFIG,
    KernelChoice,
    kernel_report,
    kernelize,
    kernelized,
    select_choice,
    unkernelize,
)

#: float32's bounds for a forward and a training step of the batch fixture (2 rows of 10 tokens): tests/rounding.py
FWD, STEP = tiny_hf(10, 2).forward_bound(), tiny_hf(10, 2).step_bound()


@pytest.fixture
def kernel_log(caplog):
    """Records of the twinkle logger (it does not propagate to the root logger caplog listens on)."""
    logger = logging.getLogger("twinkle")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="twinkle")
    yield caplog
    logger.removeHandler(caplog.handler)


def rms_norm_via_functional(self, hidden_states):
    """An independent RMSNorm implementation (torch's F.rms_norm) standing in for a fused kernel."""
    out = F.rms_norm(hidden_states.float(), (hidden_states.shape[-1],), eps=self.variance_epsilon)
    return self.weight * out.to(hidden_states.dtype)


def swiglu_via_functional(self, x):
    return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


CPU_RMS = KernelChoice("test", "rms_norm", devices=("cpu",), forward=rms_norm_via_functional)
CPU_SWIGLU = KernelChoice("test", "swiglu", devices=("cpu",), forward=swiglu_via_functional)


def _snapshot(model):
    return {name: (type(m), "forward" in vars(m), dict(vars(m))) for name, m in model.named_modules()}


def _run(model, batch):
    model.zero_grad()
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    out.float().pow(2).mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_cpu_default_chains_change_nothing_and_say_so(make_model, batch, kernel_log):
    model = make_model("qwen2")
    before, (want_out, want_grads) = _snapshot(model), _run(copy.deepcopy(model), batch)
    assert kernelize(model) is model
    assert _snapshot(model).keys() == before.keys()
    assert all(type(m) is before[n][0] and "forward" not in vars(m) for n, m in model.named_modules())
    out, grads = _run(model, batch)
    assert torch.equal(out, want_out) and all(torch.equal(grads[n], want_grads[n]) for n in grads)
    report = kernel_report(model)
    assert report.device == "cpu" and not report.changed
    assert report.chosen("rms_norm") == ["torch.rms_norm"] and report.ops["rms_norm"].modules == {"torch.rms_norm": 5}
    assert report.chosen("fused_linear_cross_entropy") == ["torch.fused_linear_cross_entropy"]
    lines = [r.getMessage() for r in kernel_log.records]
    for op in DEFAULT_KERNEL_CONFIG:
        assert sum(line.startswith(f"kernelize[cpu] {op}:") for line in lines) == 1, (op, lines)
    assert any("nothing replaced" in line and "unchanged" in line for line in lines)


def test_core_and_hf_only_change_nothing_either(make_model, kernel_log):
    import twinkle_hf.plugin
    from twinkle.plugins import Provenance, create_plugin_manager
    from twinkle.registry import Registry, set_registry

    registry = Registry(create_plugin_manager(entry_points=False, extra=[
        (twinkle_hf.plugin, Provenance("hf", "twinkle-hf", "0.1.0"))]))
    old = set_registry(registry)
    try:
        assert [c.name for c in DEFAULT_KERNEL_CONFIG["rms_norm"]] == ["liger.rms_norm", "torch.rms_norm"]
        model = make_model("qwen2")
        kernelize(model)
    finally:
        set_registry(old)
    assert not kernel_report(model).changed and not any("forward" in vars(m) for m in model.modules())
    assert any("nothing replaced" in r.getMessage() and "(liger, torch)" in r.getMessage() for r in kernel_log.records)
    unkernelize(model)


def test_accepts_an_object_with_a_model_and_returns_it(make_model):
    class FakeTwinkleModel:
        def __init__(self, model):
            self.model = model

    wrapper = FakeTwinkleModel(make_model("llama"))
    assert kernelize(wrapper, {"rms_norm": CPU_RMS}) is wrapper
    assert kernel_report(wrapper).ops["rms_norm"].replaced == 5
    assert kernel_report(wrapper.model) is kernel_report(wrapper)
    unkernelize(wrapper)
    with pytest.raises(TypeError, match="nn.Module"):
        kernelize(object())


def test_torch_baseline_env_makes_it_a_noop(make_model, monkeypatch, kernel_log):
    monkeypatch.setenv("TWINKLE_TORCH_BASELINE", "1")
    model = make_model("qwen2")
    assert kernelize(model, {"rms_norm": CPU_RMS, "swiglu": CPU_SWIGLU}) is model
    assert kernel_report(model) is None
    assert not any("forward" in vars(m) for m in model.modules())
    assert any("TWINKLE_TORCH_BASELINE=1" in r.getMessage() for r in kernel_log.records)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_replacements_match_the_original_and_unkernelize_restores_bit_for_bit(kind, make_model, batch):
    model = make_model(kind)
    reference = copy.deepcopy(model)
    before, state = _snapshot(model), {k: v.clone() for k, v in model.state_dict().items()}
    want_out, want_grads = _run(reference, batch)

    kernelize(model, {"rms_norm": [CPU_RMS], "mlp": [CPU_SWIGLU]})
    report = kernel_report(model)
    assert report.changed and report.ops["rms_norm"].replaced == 5 and report.ops["swiglu"].replaced == 2
    assert model.model.norm.forward.__func__ is rms_norm_via_functional
    out, grads = _run(model, batch)
    # tolerance: rms_norm / swiglu reimplemented in fp32 (the same sums in another order): the forward's and the
    # backward's float32 bound for the batch fixture's 2 rows of 10 tokens (tests/rounding.py)
    torch.testing.assert_close(out, want_out, **within(FWD, want_out))
    for name in want_grads:
        torch.testing.assert_close(grads[name], want_grads[name], **within(STEP, want_grads[name]))

    assert unkernelize(model) is model and kernel_report(model) is None
    assert _snapshot(model) == before
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    out, grads = _run(model, batch)
    assert torch.equal(out, want_out) and all(torch.equal(grads[n], want_grads[n]) for n in grads)


def test_context_manager_restores_even_on_error(make_model):
    model = make_model("qwen2")
    before = _snapshot(model)
    with pytest.raises(RuntimeError, match="boom"), kernelized(model, {"rms_norm": CPU_RMS}) as got:
        assert got is model and "forward" in vars(model.model.norm)
        raise RuntimeError("boom")
    assert _snapshot(model) == before


def test_class_swap_choice_and_kernelizing_twice(make_model, batch):
    model = make_model("qwen2")
    norm_cls = type(model.model.norm)
    fused_cls = type("FunctionalRMSNorm", (norm_cls,), {"forward": rms_norm_via_functional})
    want = _run(copy.deepcopy(model), batch)[0]
    kernelize(model, {"rms_norm": KernelChoice("test", "rms_norm", devices=("cpu",), module_class=fused_cls)})
    assert type(model.model.norm) is fused_cls
    torch.testing.assert_close(_run(model, batch)[0], want, **within(FWD, want))  # as above
    kernelize(model, {"swiglu": CPU_SWIGLU})  # the second call first undoes the first
    assert type(model.model.norm) is norm_cls and "forward" in vars(model.model.layers[0].mlp)
    unkernelize(model)
    assert not any("forward" in vars(m) for m in model.modules())


def test_chain_takes_first_available_choice_that_accepts_the_module(make_model):
    def broken():
        raise OSError("driver exploded")

    model = make_model("qwen2")
    chain = [
        KernelChoice("raises", "rms_norm", devices=("cpu",), available=broken, forward=rms_norm_via_functional),
        KernelChoice("elsewhere", "rms_norm", devices=("npu",), forward=rms_norm_via_functional),
        KernelChoice("picky", "rms_norm", devices=("cpu",), forward=rms_norm_via_functional,
                     accepts=lambda m: m is model.model.norm),
        KernelChoice("torch", "rms_norm"),
    ]
    assert [c.is_available("cpu") for c in chain] == [False, False, True, True]
    assert select_choice("rms_norm", "cpu", {"rms_norm": chain}, module=model.model.layers[0].input_layernorm) \
        is chain[3]
    kernelize(model, {"rms_norm": chain})
    assert kernel_report(model).ops["rms_norm"].modules == {"picky.rms_norm": 1, "torch.rms_norm": 4}
    assert "forward" in vars(model.model.norm) and "forward" not in vars(model.model.layers[0].input_layernorm)
    unkernelize(model)


def test_bad_configs_are_explained():
    with pytest.raises(ValueError, match="Unknown kernel op 'layernorm'"):
        kernelize(torch.nn.Linear(2, 2), {"layernorm": CPU_RMS})
    with pytest.raises(ValueError, match="other ops"):
        kernelize(torch.nn.Linear(2, 2), {"swiglu": CPU_RMS})
    with pytest.raises(ValueError, match="at most one"):
        KernelChoice("x", "rms_norm", forward=rms_norm_via_functional, function=rms_norm_via_functional)


def test_a_model_still_on_meta_gets_the_chains_of_the_device_it_will_run_on() -> None:
    """Issue 22, GPU defect 8: under FSDP2 a model is built on the meta device and a script kernelizes it
    before it is sharded; the chains of the model's device apply, not those of 'meta' (where no kernel is
    available, so none would apply, silently)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=64)
    with torch.device("meta"):
        module = Qwen2ForCausalLM(config)

    class Model:  # what kernelize reads of a TwinkleModel: its module and the device it trains on
        model = module
        device = torch.device("cuda", 1)

    try:
        assert kernel_report(kernelize(Model())).device == "cuda"
        assert kernel_report(kernelize(module)).device == "cpu"  # a bare module on meta: this process's platform
    finally:
        unkernelize(module)
