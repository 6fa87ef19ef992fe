"""MegatronModel on CUDA GPUs: the paths a CPU cannot run. Run by tests/gpu/run_megatron.sh.

On one GPU: Megatron DDP + the distributed optimizer, megatron-core's forward-backward schedule
over micro-batches, distributed-checkpoint save/resume, LoRA through the schedule, several
multi-LoRA tenants each with its own distributed optimizer, bf16 LoRA (frozen bf16 weights, fp32
master copies), Qwen3-MoE, fp8 and the seed-001 families the CPU cannot run through megatron
(Qwen3.5 with TE's zero-centred norms, Qwen3.5-MoE, DeepSeek-V3 with MLA and MoE; all need Transformer
Engine). On two GPUs (skipped with one):
TP=2 training against TP=1, and CP=2 (Transformer Engine) against CP=1. Models are tiny (hidden 128,
2 layers) so the whole file runs in a few minutes; dimensions are multiples of 16 for fp8.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).parent))  # megatron_two_gpus, the two-GPU torchrun script
sys.path.insert(0, str(Path(__file__).parents[1]))  # tests/rounding.py (also for the torchrun script's import)

from rounding import Shape  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (hardware)")]

VOCAB = 256


def shape(seq: int, rows: int) -> Shape:
    """The reduction lengths of hf_checkpoint's qwen2 model (hidden 128, MLP 256, head_dim 32, 2 layers) on
    ``rows`` rows of ``seq`` tokens (tests/rounding.py): float32 on the GPU (TF32 off) sums as on a CPU."""
    return Shape(hidden=128, intermediate=256, head_dim=32, layers=2, vocab=VOCAB, seq=seq, tokens=seq * rows)


def _te_available() -> bool:
    from twinkle_megatron.te import te_available

    return te_available()


needs_te = pytest.mark.skipif(not torch.cuda.is_available() or not _te_available(),
                              reason="needs transformer-engine[pytorch] on the GPU machine")


def hf_checkpoint(directory: Path, family: str = "qwen2", seed: int = 0) -> Path:
    import transformers

    kwargs = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=256, tie_word_embeddings=False)
    if family == "qwen3_moe":
        kwargs.update(head_dim=32, moe_intermediate_size=64, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
    config = getattr(transformers, {"qwen2": "Qwen2Config", "qwen3_moe": "Qwen3MoeConfig"}[family])(**kwargs)
    torch.manual_seed(seed)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(str(directory))
    return directory


def batch(seed: int, rows: int = 8, length: int = 32) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (rows, length), generator=gen)
    labels = ids.clone()
    labels[:, :4] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def model(path: Path, **kwargs):
    from twinkle.model import MegatronModel

    return MegatronModel(model_id=str(path), **kwargs)


def test_tp1_training_through_the_schedule_lowers_the_loss(tmp_path):
    m = model(hf_checkpoint(tmp_path / "hf"), mixed_precision="bf16")
    m.set_optimizer("default", lr=1e-3)
    m.set_lr_scheduler("default", lr_warmup_steps=2, lr_decay_steps=20, lr_decay_style="cosine")
    assert "DistributedOptimizer" in m.get_train_configs()
    fixed = batch(seed=1)
    losses = []
    for _ in range(12):
        losses.append(m.forward_backward(inputs=fixed, num_microbatches=2))
        m.clip_grad_and_step(1.0)
    assert losses[-1] < losses[0] - 0.5, losses
    metrics = m.calculate_metric(True)
    assert metrics["grad_norm"] > 0 and metrics["step"] == 12


def test_four_microbatches_give_the_loss_and_gradient_of_one_batch(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # float32 products (torch's default)
    path = hf_checkpoint(tmp_path / "hf")
    data = batch(seed=2)
    data["labels"][0, 10:] = -100  # unequal token counts per micro-batch: the mean must be token-weighted
    norms, losses = [], []
    for micro in (1, 4):
        m = model(path, mixed_precision="no")
        m.set_optimizer("default", lr=1e-3)
        losses.append(m.forward_backward(inputs=data, num_microbatches=micro))
        norms.append(m.clip_grad_norm(1.0))
    from transformers import AutoModelForCausalLM

    from twinkle.loss import CrossEntropyLoss

    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).cuda()
    on_gpu = {k: v.cuda() for k, v in data.items()}
    with torch.no_grad():
        ref = CrossEntropyLoss()(on_gpu, {"logits": hf(input_ids=on_gpu["input_ids"]).logits})["loss"]
    # float32, the same sums grouped otherwise (micro-batches, megatron's kernels vs HF's): a forward's bound for
    # the losses, a step's for the gradient norm, of 8 rows of 32 tokens (tests/rounding.py); the masked rows'
    # token-weighted mean is what a mistake (a mean of micro-batch means) moves by far more
    assert losses[0] == pytest.approx(losses[1], rel=shape(32, 8).forward_bound(), abs=0)
    assert losses[0] == pytest.approx(ref.item(), rel=shape(32, 8).forward_bound(), abs=0)
    assert norms[0] == pytest.approx(norms[1], rel=shape(32, 8).step_bound(), abs=0)


def _run(m, start: int, steps: int) -> list[float]:
    out = []
    for step in range(start, start + steps):
        out.append(m.forward_backward(inputs=batch(seed=100 + step), num_microbatches=2))
        m.clip_grad_and_step(1.0)
    return out


def _fresh(path: Path):
    m = model(path, mixed_precision="bf16")
    m.set_optimizer("default", lr=1e-3, weight_decay=0.01)
    m.set_lr_scheduler("default", lr_warmup_steps=1, lr_decay_steps=6, lr_decay_style="linear")
    return m


def test_distributed_optimizer_save_and_resume_continue_the_same_losses(tmp_path):
    path = hf_checkpoint(tmp_path / "hf")
    straight = _run(_fresh(path), 0, 4)
    first = _fresh(path)
    head = _run(first, 0, 2)
    checkpoint = first.save("step-2", output_dir=str(tmp_path), save_optimizer=True, consumed_train_samples=16)
    assert (Path(checkpoint) / "optimizer_dist").is_dir() and (Path(checkpoint) / "scheduler.pt").is_file()
    resumed = _fresh(Path(checkpoint))
    assert resumed.resume_from_checkpoint(checkpoint)["cur_step"] == 2
    tail = _run(resumed, 2, 2)
    # Kept, not derived: the same operations on the same inputs (bitwise on CPU, tests/megatron), but CUDA
    # kernels that add with atomics (flash/fused attention's backward) order float32 additions run by run, and
    # bf16 with AdamW's eps 1e-8 amplifies that past any bound of tests/rounding.py; 1e-5 is far below what a
    # lost optimizer state or scheduler step moves (a resumed AdamW without its moments steps ~lr per weight)
    assert head + tail == pytest.approx(straight, rel=1e-5, abs=1e-5)


def test_a_crafted_optimizer_dist_metadata_is_refused_before_megatron_reads_it(tmp_path):
    """megatron's reader unpickles optimizer_dist/.metadata; twinkle checks it first (issue 13)."""
    import pickle
    import shutil

    from twinkle.checkpoint import CheckpointError
    from twinkle.checkpoint.dcp_safe import verify_dcp_directory

    path = hf_checkpoint(tmp_path / "hf")
    first = _fresh(path)
    _run(first, 0, 1)
    checkpoint = Path(first.save("step-1", output_dir=str(tmp_path), save_optimizer=True))
    verify_dcp_directory(checkpoint / "optimizer_dist")  # megatron's own metadata passes the allow-list
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').write('pwned')",))

    evil = tmp_path / "evil"
    shutil.copytree(checkpoint, evil)
    (evil / "optimizer_dist" / ".metadata").write_bytes(pickle.dumps(Payload()))
    resumed = _fresh(path)
    before = {k: v.clone() for k, v in resumed.get_state_dict().items()}
    with pytest.raises(CheckpointError, match="never executes pickled code"):
        resumed.resume_from_checkpoint(str(evil))
    assert not marker.exists()
    assert all(torch.equal(before[k], v) for k, v in resumed.get_state_dict().items())


def test_lora_through_the_schedule_trains_and_saves_a_peft_adapter(tmp_path):
    from peft import LoraConfig, PeftModel
    from transformers import AutoModelForCausalLM

    path = hf_checkpoint(tmp_path / "hf")
    m = model(path, mixed_precision="no")
    m.add_adapter_to_model("a", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    m.set_optimizer("default", lr=1e-2, adapter_name="a")
    fixed = batch(seed=3)
    losses = []
    for _ in range(7):
        losses.append(m.forward_backward(inputs=fixed, num_microbatches=2))
        m.clip_grad_and_step(1.0)
    assert losses[-1] < losses[0] - 0.05, losses
    saved = m.save("adapter", output_dir=str(tmp_path))
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32),
                                           saved).cuda().eval()
    probe = batch(seed=4, rows=2)
    with torch.no_grad():
        ref = peft_model(input_ids=probe["input_ids"].cuda()).logits
    ours = m.forward_only(inputs=probe)["logits"]
    assert (ours.float() - ref).abs().max() <= 1e-3


@needs_te
def test_qwen3_moe_logits_match_hf(tmp_path):
    _megatron_matches_hf(hf_checkpoint(tmp_path / "hf", family="qwen3_moe"))


def _megatron_matches_hf(path: Path):
    """MegatronModel (fp32) on the HF checkpoint ``path``: its logits within 1e-3 of transformers' on a probe
    batch; returns (model, probe, HF logits) for further checks."""
    from transformers import AutoModelForCausalLM

    m = model(path, mixed_precision="no")
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).cuda().eval()
    probe = batch(seed=5, rows=2)
    with torch.no_grad():
        ref = hf(input_ids=probe["input_ids"].cuda()).logits
    assert (m.forward_only(inputs=probe)["logits"] - ref).abs().max() <= 1e-3
    return m, probe, ref


def family_checkpoint(directory: Path, family: str) -> Path:
    """Tiny seed-001 families the CPU cannot run through megatron (TE spec, MoE layers): docs/models.md."""
    import transformers

    common = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=VOCAB, max_position_embeddings=256, tie_word_embeddings=False)
    full = ["full_attention", "full_attention"]
    configs = {
        "qwen3_5": lambda: transformers.Qwen3_5TextConfig(**common, intermediate_size=256, head_dim=32,
                                                          layer_types=full),
        "qwen3_5_moe": lambda: transformers.Qwen3_5MoeTextConfig(**common, head_dim=32, moe_intermediate_size=64,
                                                                 shared_expert_intermediate_size=64, num_experts=4,
                                                                 num_experts_per_tok=2, layer_types=full),
        "deepseek_v3": lambda: transformers.DeepseekV3Config(**{**common, "num_key_value_heads": 4},
                                                             intermediate_size=256, moe_intermediate_size=64,
                                                             n_routed_experts=4, num_experts_per_tok=2, n_group=2,
                                                             topk_group=1, first_k_dense_replace=1, q_lora_rank=64,
                                                             kv_lora_rank=32, qk_nope_head_dim=32,
                                                             qk_rope_head_dim=16, v_head_dim=32),
    }
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(configs[family](), dtype=torch.float32)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name and param.dim() == 1:
                param.add_(0.2 * torch.randn_like(param))
    hf.save_pretrained(str(directory))
    return directory


@needs_te
@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe", "deepseek_v3"])
def test_seed_family_logits_match_hf_with_te(tmp_path, family):
    """Qwen3.5 (gated attention, TE's zero-centred norms), Qwen3.5-MoE (gated shared expert) and DeepSeek-V3
    (MLA with TE's duplicated down projections, sigmoid group-limited routing, shared experts): written and
    round-trip tested on CPU (tests/families), their TE/MoE forward only here."""
    from transformers import AutoModelForCausalLM

    m, probe, ref = _megatron_matches_hf(family_checkpoint(tmp_path / "hf", family))
    m.save("exported", output_dir=str(tmp_path))  # the export path (gather, TE names) writes HF names back
    again = AutoModelForCausalLM.from_pretrained(str(tmp_path / "exported"), dtype=torch.float32).cuda().eval()
    with torch.no_grad():
        assert (again(input_ids=probe["input_ids"].cuda()).logits - ref).abs().max() == 0


@needs_te
def test_fp8_training_step(tmp_path):
    m = model(hf_checkpoint(tmp_path / "hf"), mixed_precision="fp8")
    assert m.transformer_config.fp8 == "hybrid"
    m.set_optimizer("default", lr=1e-3)
    first = m.forward_backward(inputs=batch(seed=6), num_microbatches=2)
    m.clip_grad_and_step(1.0)
    assert first == first and 0 < first < 20  # finite
    assert m.calculate_metric(True)["step"] == 1


def test_several_tenants_train_interleaved_like_each_alone(tmp_path):
    """Every tenant has its own Megatron-DDP chunk and distributed optimizer; nothing leaks between them.

    The scenario is the simulated GPU path's (tests/megatron/scripts/simulated_cuda.py), here on a GPU in bf16.
    """
    sys.path.insert(0, str(Path(__file__).parents[1] / "megatron" / "scripts"))
    from simulated_cuda import several_tenants

    report = several_tenants(hf_checkpoint(tmp_path / "hf"), mixed_precision="bf16")
    book = report["tenants_bookkeeping"]
    assert book["kinds"] == ["megatron-core DistributedOptimizer"] * 2
    assert book["own_chunks"] and book["chunk_params_are_the_slot"] and book["reused_chunk"]
    # Kept, not derived: each tenant runs the same operations on the same inputs interleaved or alone (bitwise on
    # CPU, tests/megatron/test_gpu_path_simulated.py); on CUDA, atomics in attention's backward may order float32
    # additions run by run, amplified by bf16 and AdamW's eps 1e-8 past any bound; a leak between tenants (a
    # shared buffer, another's gradient) moves a loss by far more than 1e-5
    for tenant in ("t1", "t2"):
        assert report["tenants_interleaved"][tenant] == pytest.approx(report["tenants_alone"][tenant], rel=1e-5)
    assert all(report["tenants_untouched"])
    assert report["tenants_reacquired"] == pytest.approx(report["tenants_alone"]["t1"], rel=1e-5)


def test_bf16_lora_keeps_frozen_weights_bf16_and_fp32_master_copies(tmp_path):
    from peft import LoraConfig

    m = model(hf_checkpoint(tmp_path / "hf"), mixed_precision="bf16")
    m.add_adapter_to_model("a", LoraConfig(r=8, lora_alpha=16, target_modules="all-linear"))
    m.set_optimizer("default", lr=1e-2, adapter_name="a")
    lora = [p for n, p in m.gpt.named_parameters() if ".lora_" in n]
    frozen = [p for n, p in m.gpt.named_parameters() if ".lora_" not in n]
    masters = [p for g in m.optimizer_group["a"].optimizer.optimizer.optimizer.param_groups for p in g["params"]]
    assert {p.dtype for p in frozen} == {torch.bfloat16} and {p.dtype for p in masters} == {torch.float32}
    assert sum(p.numel() for p in masters) == sum(p.numel() for p in lora)  # one GPU: dp = 1, no sharding
    fixed = batch(seed=3)
    losses = []
    for _ in range(6):
        losses.append(m.forward_backward(inputs=fixed, num_microbatches=2))
        m.clip_grad_and_step(1.0)
    assert losses[-1] < losses[0] - 0.05, losses


def _two_gpu_run(tmp_path: Path, path: Path, layout: str) -> list[dict]:
    import json
    import subprocess
    import sys

    out = tmp_path / layout
    out.mkdir()
    script = Path(__file__).parent / "megatron_two_gpus.py"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script), str(path), layout, str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-6000:]
    return json.loads((out / "rank0.json").read_text())


needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs (hardware)")


@needs_two_gpus
def test_tp2_training_gives_the_tp1_losses_and_grad_norms(tmp_path):
    from megatron_two_gpus import STEPS, TP2_ADAM_EPS, steps

    path = hf_checkpoint(tmp_path / "hf")
    torch.backends.cuda.matmul.allow_tf32 = False
    reference = steps(model(path, mixed_precision="no"), adam_eps=TP2_ADAM_EPS)
    tp2 = _two_gpu_run(tmp_path, path, "tp2")
    assert len(reference) == STEPS
    # float32 (TF32 off), TP's split products and all-reduces: only summation order differs; each step of 8 rows
    # of 64 tokens within a step's bound (tests/rounding.py), step k carrying the k - 1 earlier steps' rounding
    # twice (Adam with eps 1: Lipschitz in the gradient)
    bound = (2 * (STEPS - 1) + 1) * shape(64, 8).step_bound()
    assert [s["loss"] for s in tp2] == pytest.approx([s["loss"] for s in reference], rel=bound, abs=0)
    assert [s["grad_norm"] for s in tp2] == pytest.approx([s["grad_norm"] for s in reference], rel=bound, abs=0)


@needs_two_gpus
@needs_te
def test_cp2_training_gives_the_cp1_losses(tmp_path):
    """Context parallelism needs TE's fused/flash attention, hence bf16: losses and the first gradient norm agree
    to bf16 precision.

    Tolerances kept, not derived: CP=2 splits each row's attention over two GPUs (TE's ring, partial softmax
    sums combined in float32) and the products run on half the tokens (other GEMM tilings), so bf16 values along
    a token's path may round one ulp (2 U_BF16, tests/rounding.py) apart at each of ~20 ops; the first loss is
    a mean over 480 tokens of such differences (5e-3 ~ 1.3 U_BF16), the first gradient norm sums them once more
    (2e-2 ~ 5 U_BF16), and the later losses follow AdamW (eps 1e-8) steps, past any bound. What a CP mistake
    moves is far larger: a token count summed over CP twice halves the gradient norm."""
    from megatron_two_gpus import steps

    path = hf_checkpoint(tmp_path / "hf")
    reference = steps(model(path, mixed_precision="bf16"))
    cp2 = _two_gpu_run(tmp_path, path, "cp2")
    assert cp2[0]["loss"] == pytest.approx(reference[0]["loss"], rel=5e-3)  # before any update
    # the first gradient, before clipping or any update: a token count summed over CP twice halves it
    assert cp2[0]["grad_norm"] == pytest.approx(reference[0]["grad_norm"], rel=2e-2)
    assert [s["loss"] for s in cp2] == pytest.approx([s["loss"] for s in reference], rel=2e-2)
