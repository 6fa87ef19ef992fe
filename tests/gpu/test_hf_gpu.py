"""TransformersModel on one CUDA GPU: what a CPU cannot show. Run by tests/gpu/run_all.sh.

bf16 and fp16 LoRA training with falling loss and the frozen base held in the low-precision dtype;
the fused linear cross entropy's memory against materialised logits; the meta-device sharded load
(build on meta, FSDP2 over a one-GPU NCCL mesh, each parameter read from the safetensors files)
against a plain ``from_pretrained`` on the GPU; the full-model export gathered to the CPU.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hf"))

from hf_testing import make_batch, tiny_config  # noqa: E402
from rounding import U_BF16  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (hardware)")]


@pytest.fixture(autouse=True)
def _on_cuda(monkeypatch):
    monkeypatch.setenv("TWINKLE_DEVICE", "cuda")


def _lora():
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_lora_trains_with_a_low_precision_frozen_base(precision: str) -> None:
    from twinkle.model import TransformersModel

    torch.manual_seed(0)
    model = TransformersModel(config=tiny_config("qwen2", hidden_size=128, intermediate_size=256),
                              mixed_precision=precision)
    model.add_adapter_to_model("a", _lora())
    model.set_optimizer("AdamW", lr=5e-3)
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    dtypes = {(p.dtype, p.requires_grad, p.device.type) for p in model.model.parameters()}
    assert dtypes == {(low, False, "cuda"), (torch.float32, True, "cuda")}
    batch = make_batch(5, rows=8, length=32)
    losses = []
    for _ in range(8):
        losses.append(model.forward_backward(inputs=batch))
        model.clip_grad_and_step()
    assert losses[-1] < losses[0] - 0.1, losses
    assert model.optimizer_group["a"].cur_step + model.optimizer_group["a"].skipped_steps == 8


def test_fused_linear_ce_never_holds_the_logits_on_cuda() -> None:
    """A 32k vocabulary: the fused loss's peak is far below the materialised logits' (and the losses agree)."""
    from twinkle.model import TransformersModel

    config = tiny_config("qwen2", hidden_size=256, intermediate_size=512, vocab_size=32000)
    batch = make_batch(1, rows=8, length=512, vocab=32000)
    peaks, losses = {}, {}
    for name in ("plain", "fused"):
        torch.manual_seed(0)
        model = TransformersModel(config=config, mixed_precision="bf16")
        task = None
        if name == "fused":
            model.set_loss("LigerFusedLinearCrossEntropyLoss")
            task = "fused_lm_ce"
        model.set_optimizer("AdamW", lr=1e-3)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        losses[name] = model.forward_backward(inputs=batch, task=task)
        torch.cuda.synchronize()
        peaks[name] = torch.cuda.max_memory_allocated() - base
        if name == "plain":  # the largest logit (no step was taken: the weights of the loss above)
            with torch.no_grad():
                scale = float(model.forward_only(inputs=batch)["logits"].abs().max())
        del model
        torch.cuda.empty_cache()
    logits_bytes = 8 * 512 * 32000 * 2  # bf16
    assert peaks["plain"] >= logits_bytes
    assert peaks["fused"] < 0.5 * peaks["plain"], peaks
    # The same backbone kernels on the same inputs give the same bf16 hidden states; only the head differs: each
    # logit is a float32-accumulated product rounded to bf16 (the plain lm_head's output; liger's chunk), nearly
    # the same float32 value rounded twice, so at most one bf16 ulp apart (2 U_BF16 |z|, tests/rounding.py), and
    # both losses take it in float32. A token's loss lse(z) - z_y moves by at most twice the largest logit's move.
    room = 2 * 2 * U_BF16 * scale
    assert losses["fused"] == pytest.approx(losses["plain"], rel=0, abs=room)
    assert room < 1e-2 * losses["plain"]  # a wrong reduction, shift or ignored-row mask moves the loss far more


@pytest.fixture
def nccl_world(monkeypatch):
    """A one-rank NCCL process group (what torchrun gives a single GPU), torn down afterwards."""
    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")  # one rank: its store binds a free port (a fixed one can collide)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    yield
    dist.destroy_process_group()


def test_meta_build_and_sharded_load_on_one_gpu(tmp_path, nccl_world) -> None:
    """build on meta -> adapter -> fully_shard (1-GPU mesh) -> to_empty -> read shards: the plain GPU weights."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM

    from twinkle_hf.distributed import shard_load
    from twinkle_hf.model.meta import adapters_stay_real, build_on_meta, file_key, hold_frozen_in, on_meta

    torch.manual_seed(3)
    AutoModelForCausalLM.from_config(tiny_config("qwen2", vocab_size=129)).save_pretrained(str(tmp_path))
    model, why = build_on_meta(AutoModelForCausalLM, str(tmp_path), None, {})
    assert model is not None and on_meta(model), why
    from peft import get_peft_model

    with adapters_stay_real(model):
        model = get_peft_model(model, _lora(), adapter_name="a")
    hold_frozen_in(model, "bf16", [p for p in model.parameters() if p.requires_grad])
    kept = shard_load.real_tensors(model)
    mesh = init_device_mesh("cuda", (1,))
    for layer in model.base_model.model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    shard_load.materialize(model, torch.device("cuda", 0), kept)
    shard_load.fill_from_checkpoint(model, tmp_path, skip=set(kept))

    plain = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).cuda()
    reference = dict(plain.named_parameters())
    for name, param in model.named_parameters():
        local = param.to_local()
        assert local.device.type == "cuda", name
        if file_key(name) in reference:
            assert torch.equal(local, reference[file_key(name)].detach().to(local.dtype)), name
        else:  # the adapter keeps peft's initial values
            assert torch.equal(local.cpu(), kept[name]), name
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, dict(plain.named_buffers())[file_key(name)]), name
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    assert all(t.device.type == "cpu" for t in state.values())


def test_liger_through_kernelize_trains_like_the_plain_model() -> None:
    """kernelize with the installed kernels (liger on CUDA) on a bf16 model: liger's choices are taken and the
    first losses agree with the plain model's within bf16's rounding.

    Tolerance kept, not derived: liger's rms_norm / swiglu / rope round their float32 results to bf16 where the
    plain ops round other intermediates, so the two paths differ by up to a bf16 ulp (2 U_BF16) at each of ~9 ops
    of a token's path, amplified by the layers after them, and three AdamW steps (eps 1e-8) follow; no bound of
    tests/rounding.py covers that. rel 2e-2 (~5 U_BF16) is a sanity check that liger's kernels compute the same
    functions: a wrong one (rope on the wrong half, a norm without its weight) moves a loss by far more."""
    pytest.importorskip("liger_kernel")
    from twinkle.kernel import kernel_report, kernelize
    from twinkle.model import TransformersModel

    config = tiny_config("qwen2", hidden_size=256, intermediate_size=512, vocab_size=4096)
    batch = make_batch(2, rows=4, length=256, vocab=4096)
    losses = {}
    for name in ("plain", "liger"):
        torch.manual_seed(0)
        model = TransformersModel(config=config, mixed_precision="bf16")
        if name == "liger":
            kernelize(model)
            assert kernel_report(model).chosen("rms_norm") == ["liger.rms_norm"]
        model.set_optimizer("AdamW", lr=1e-3)
        losses[name] = []
        for _ in range(3):
            losses[name].append(float(model.forward_backward(inputs=batch)))
            model.clip_grad_and_step()
    assert losses["liger"] == pytest.approx(losses["plain"], rel=2e-2)


def test_fp8_trains_through_torchao_float8_layers() -> None:
    """mixed_precision='fp8' on a GPU with FP8 tensor cores: the decoder linears are Float8Linear and the loss
    falls; elsewhere the model is refused (tests/hf/test_fp8.py checks the message)."""
    pytest.importorskip("torchao")
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no FP8 tensor cores on this GPU (compute capability < 8.9)")
    from torchao.float8.float8_linear import Float8Linear

    from twinkle.model import TransformersModel

    torch.manual_seed(0)
    model = TransformersModel(config=tiny_config("qwen2", hidden_size=256, intermediate_size=512, vocab_size=4096),
                              mixed_precision="fp8")
    assert sum(isinstance(m, Float8Linear) for m in model.model.modules()) == 2 * 7
    model.set_optimizer("AdamW", lr=1e-3)
    batch = make_batch(3, rows=4, length=256, vocab=4096)
    losses = []
    for _ in range(6):
        losses.append(float(model.forward_backward(inputs=batch)))
        model.clip_grad_and_step()
    assert losses[-1] < losses[0] - 0.1, losses
