"""A full-weight sync to vLLM in bounded buckets of the engine's dtype (a fake engine records what it is handed)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hf_testing import make_model

from twinkle_hf.sampler import VLLMSampler
from twinkle_hf.sampler.weight_stream import weight_buckets


class _Engine:
    """What VLLMSampler uses of a vllm.LLM for a full sync: model_config.dtype, apply_model, reset_prefix_cache."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(dtype=dtype))
        self.calls: list[list[tuple[str, torch.Tensor]]] = []
        self.resets = 0

    def apply_model(self, fn) -> None:
        model = torch.nn.Module()  # no LoRA-wrapped layers: the names are kept
        model.load_weights = lambda weights: self.calls.append(list(weights))
        fn(model)

    def reset_prefix_cache(self) -> None:
        self.resets += 1


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for _, t in tensors)


@pytest.fixture(autouse=True)
def _in_process_engine(monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the fake engine runs here


def test_a_full_sync_sends_bf16_buckets_no_larger_than_asked(tmp_path) -> None:
    model = make_model(seed=1)  # fp32 weights, as a trainer holds them
    state = {k: v.detach().clone() for k, v in model.backend.hf_model().state_dict().items()}
    largest = max(t.numel() * 2 for t in state.values())
    bucket = 4 * largest  # several buckets for this model
    engine = _Engine(torch.bfloat16)
    VLLMSampler(engine=engine, adapter_dir=str(tmp_path), sync_bucket_bytes=bucket).sync_weights(model)

    assert len(engine.calls) > 1 and engine.resets == 1  # streamed; the prefix cache dropped once, at the end
    assert max(_nbytes(call) for call in engine.calls) <= bucket  # what the rank held (and vLLM unpickled) at once
    received = dict(pair for call in engine.calls for pair in call)
    assert received.keys() == state.keys()
    for name, tensor in state.items():
        assert received[name].dtype == torch.bfloat16, name
        assert torch.equal(received[name], tensor.to(torch.bfloat16)), name
    assert _nbytes(received.items()) * 2 == _nbytes(state.items())  # half the fp32 state's bytes in all


def test_an_engine_without_a_dtype_gets_the_weights_as_they_are_and_a_huge_tensor_goes_alone() -> None:
    model = make_model(seed=2)
    state = model.backend.hf_model().state_dict()
    buckets = list(weight_buckets(model.backend.hf_model(), None, bucket_bytes=1))  # every tensor is "too big"
    assert [len(b) for b in buckets] == [1] * len(state)
    assert all(t.dtype == state[n].dtype and torch.equal(t, state[n]) for b in buckets for n, t in b)
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        next(weight_buckets(model.backend.hf_model(), None, bucket_bytes=0))


@pytest.mark.slow
def test_every_fsdp2_rank_sends_full_bf16_tensors_one_bucket_at_a_time(tmp_path) -> None:
    """Two gloo ranks, FSDP2: every rank gathers each tensor (the collectives line up), holds one 64 KiB bf16
    bucket at a time (not the full fp32 state), and what it hands over equals a one-process model's weights."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from hf_testing import tiny_config
    from transformers import AutoModelForCausalLM

    script = Path(__file__).resolve().parent / "scripts" / "weight_sync_job.py"
    env = {**os.environ, "TWINKLE_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(tmp_path)], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    torch.manual_seed(0)  # the job's build: the same seeded initialisation on one process
    reference = AutoModelForCausalLM.from_config(tiny_config("qwen2", vocab_size=2048), dtype=torch.float32)
    state = reference.state_dict()
    fp32_bytes = sum(t.numel() * 4 for t in state.values())
    largest = max(t.numel() * 2 for t in state.values())  # a tensor above the bucket size goes alone
    for rank in range(2):
        result = torch.load(tmp_path / f"sync.rank{rank}.pt", weights_only=True)
        assert result["dtypes"] == ["torch.bfloat16"]
        assert len(result["bucket_bytes"]) > 2 and max(result["bucket_bytes"]) <= max(64 * 1024, largest)
        assert max(result["bucket_bytes"]) < fp32_bytes / 4  # what the old full fp32 gather held, a quarter of it
        assert result["local_numel"] < sum(t.numel() for t in state.values())  # the rank held shards only
        assert result["tensors"].keys() == state.keys()
        for name, tensor in state.items():
            assert torch.equal(result["tensors"][name], tensor.to(torch.bfloat16)), name
