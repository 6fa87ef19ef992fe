"""Tensor parallelism under torchrun (gloo) trains like one process: tp=2 on 2 ranks and FSDP2 x TP
(fsdp=2 x tp=2) on 4 ranks; full fine-tuning and LoRA on a tiny Qwen2, and full fine-tuning of a tiny Qwen3
(per-head q_norm/k_norm) with gradient accumulation. A checkpoint written on the 4 ranks resumes on 2 (FSDP2
alone) and on 1 process with the uninterrupted run's next losses; its HF export loads in plain transformers/peft.

Two launches run the scenarios of ``scripts/tp_job.py`` (the 4-rank one, then the 2-rank one in its directory,
which also resumes the 4-rank checkpoint); the reference is the same code in this process.

Bound: tensor parallelism changes only the order of float32 sums (a row-parallel matmul adds two half
sums, the LM head's logits and the vocabulary-parallel embedding are gathered), so two runs differ by the
rounding of one step, ``Shape.step_bound()`` relative (tests/rounding.py), for the tiny Qwen2 of
``hf_testing.tiny_config`` (hidden 64, MLP 128, head_dim 16, 2 layers, vocab 128) on 4 rows of 12 tokens
(the Qwen3 has the same lengths; its micro-batches are shorter, so the bound covers them).
Under SGD the differences of successive steps add (as in tests/golden/golden_bounds.py): ``STEPS`` times
that bound for losses, grad norms and weight updates.
"""

from __future__ import annotations

import pytest
import torch
from launch import JobResult, torchrun
from rounding import LORA_TERMS, Shape
from tp_job import MOMENTUM, ROWS, SEQ, STEPS, resumed, run

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)

SHAPE = Shape(hidden=64, intermediate=128, head_dim=16, layers=2, vocab=128, seq=SEQ, tokens=SEQ * ROWS,
              extra=LORA_TERMS)  # the adapters' low-rank sums (rank 4 on 8 modules: within LORA_TERMS)
BOUND = STEPS * SHAPE.step_bound()  # ~1.5e-4 relative
FORWARD = SHAPE.step_bound()  # one forward of the trained model (the export against the live model)
TP2 = {"tp_full": {"lora": False}, "tp_lora": {"lora": True},
       "tp_qwen3_accum": {"lora": False, "family": "qwen3", "accumulation": 2}}
FSDP_TP = {f"fsdp_{name}": {**kwargs, "fsdp": 2} for name, kwargs in TP2.items()}
SCENARIOS = {**TP2, **FSDP_TP}
EXPORTED = ("tp_full", "tp_lora", "fsdp_tp_full", "fsdp_tp_lora")
CKPT = {"full": False, "lora": True}
# Resumed runs: the restored weights and momentum are exact copies; every later gradient differs by one step's
# rounding (SHAPE.step_bound()) and enters each later update through the momentum sum, whose weights add up to
# at most 1 / (1 - momentum); under SGD the differences of the STEPS steps add.
RESUME_BOUND = STEPS * SHAPE.step_bound() / (1 - MOMENTUM)


@pytest.fixture(scope="module")
def fsdp_tp_job(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    """4 ranks: FSDP2 x TP training, and the checkpoints the 2-rank launch and this process resume."""
    out = tmp_path_factory.mktemp("tp_job")
    result = torchrun("tp_job.py", [*FSDP_TP, *(f"fsdp_tp_ckpt_{k}" for k in CKPT)], out, nproc=4, timeout=600)
    assert result.returncode == 0, f"torchrun FSDP2 x TP job failed:\n{result.output[-6000:]}"
    return result


@pytest.fixture(scope="module")
def tp_job(fsdp_tp_job: JobResult) -> JobResult:
    """2 ranks, in the 4-rank job's directory: tp=2 training, and the 4-rank checkpoints resumed on FSDP2."""
    result = torchrun("tp_job.py", [*TP2, *(f"resume_fsdp_{k}" for k in CKPT)], fsdp_tp_job.out_dir, timeout=500)
    assert result.returncode == 0, f"torchrun tensor-parallel job failed:\n{result.output[-6000:]}"
    return result


def job_of(name: str, tp_job: JobResult, fsdp_tp_job: JobResult) -> tuple[JobResult, int]:
    return (fsdp_tp_job, 4) if name.startswith("fsdp_") else (tp_job, 2)


@pytest.fixture(scope="module")
def references() -> dict:
    """One process: an FSDP2 x TP scenario's reference is its tp=2 one's (the same steps on the whole batch)."""
    want = {name: run(out=None, **kwargs) for name, kwargs in TP2.items()}
    return {**want, **{f"fsdp_{name}": want[name] for name in TP2}}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_tp2_matches_one_process(name: str, tp_job: JobResult, fsdp_tp_job: JobResult, references: dict) -> None:
    want = references[name]
    job, nproc = job_of(name, tp_job, fsdp_tp_job)
    ranks = [job.load(name, r) for r in range(nproc)]
    scale = max((want["params"][k] - want["initial"][k]).abs().max().item() for k in want["params"])
    assert all(r["losses"] == ranks[0]["losses"] and r["grad_norms"] == ranks[0]["grad_norms"] for r in ranks)
    for got in ranks:
        assert got["wrapped"] == ("fsdp2" if nproc == 4 else "tp")
        assert got["losses"] == pytest.approx(want["losses"], rel=BOUND, abs=0)
        assert got["grad_norms"] == pytest.approx(want["grad_norms"], rel=BOUND, abs=0)
        assert sorted(got["params"]) == sorted(want["params"])
        for key, value in want["params"].items():  # the weight updates, relative to the largest one
            assert (got["params"][key] - value).abs().max().item() <= BOUND * scale, key
    # the comparison is not vacuous: SGD moved the weights far beyond the bound
    largest = max(want["initial"][k].abs().max().item() for k in want["params"])
    assert scale / largest > 100 * BOUND


def test_tp2_holds_half_of_the_decoder_layers(tp_job: JobResult, fsdp_tp_job: JobResult, references: dict) -> None:
    """Per-rank parameter bytes of the decoder layers (the embedding and head dominate a tiny model): half at
    tp=2, a quarter at fsdp=2 x tp=2 (FSDP2 shards the tensor-parallel shards and the replicated norms)."""
    for name in SCENARIOS:
        job, nproc = job_of(name, tp_job, fsdp_tp_job)
        for rank in range(nproc):
            got = job.load(name, rank)["layer_bytes"]
            limit = 0.55 * references[name]["layer_bytes"] * 2 / nproc
            assert got <= limit, (name, got, references[name]["layer_bytes"])


@pytest.mark.parametrize("name", EXPORTED)
def test_tp2_state_and_export_are_full_tensors(name: str, tp_job: JobResult, fsdp_tp_job: JobResult,
                                               references: dict) -> None:
    """get_state_dict gathers; the export loads in plain transformers (+ peft) with the live model's logits."""
    import transformers
    from hf_testing import tiny_config
    from peft import PeftModel

    got = job_of(name, tp_job, fsdp_tp_job)[0].load(name, 0)
    assert got["state_is_full"] and got["state_keys"] == references[name]["state_keys"]
    if SCENARIOS[name]["lora"]:
        torch.manual_seed(0)  # the base weights TransformersModel(config=...) drew under seed 0
        plain = PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_config(tiny_config("qwen2")),
                                          got["export"])
    else:
        plain = transformers.AutoModelForCausalLM.from_pretrained(got["export"])
    batch = got["held_out"]
    with torch.no_grad():
        logits = plain(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(logits, got["logits"], rtol=FORWARD, atol=FORWARD * got["logits"].abs().max().item())


@pytest.mark.parametrize("kind", sorted(CKPT))
def test_fsdp_tp_checkpoint_resumes_on_two_ranks_and_one(kind: str, tp_job: JobResult, fsdp_tp_job: JobResult) -> None:
    """The 4-rank (fsdp=2 x tp=2) checkpoint -- DCP shards of weights and momentum -- resumed on FSDP2 over 2
    ranks (the default strategy: accelerate's FSDP2) and on 1 process: the next losses are the uninterrupted
    4-rank run's."""
    want = fsdp_tp_job.load(f"fsdp_tp_ckpt_{kind}", 0)
    on_two = [tp_job.load(f"resume_fsdp_{kind}", r) for r in (0, 1)]
    on_one = resumed(CKPT[kind], fsdp_tp_job.out_dir, fsdp=2)
    assert [r["wrapped"] for r in on_two] == ["accelerate_fsdp2"] * 2 and on_one["wrapped"] == "none"
    # the weight updates after the checkpoint, relative to the largest one
    scale = max((want["params"][k] - want["at_save"][k]).abs().max().item() for k in want["params"])
    for got in (*on_two, on_one):
        assert got["resumed"] == pytest.approx(want["continued"], rel=RESUME_BOUND, abs=0)
        assert sorted(got["params"]) == sorted(want["params"])
        for key, value in want["params"].items():
            assert (got["params"][key] - value).abs().max().item() <= RESUME_BOUND * scale, key
    # not vacuous: a resume that lost the checkpoint's weights would be off by their first steps' update
    before = max((want["at_save"][k] - want["initial"][k]).abs().max().item() for k in want["params"])
    assert before > 100 * RESUME_BOUND * scale


# ------------------------------------------------------------------ refusals (no launch)
def test_tp_layouts_and_the_refused_ddp_x_tp() -> None:
    from twinkle import DeviceMesh
    from twinkle_hf.distributed.plan import make_plan

    plan = make_plan("native_fsdp", DeviceMesh.from_sizes(tp_size=2, fsdp_size=2, world_size=4), world_size=4)
    assert (plan.kind, plan.fsdp_size, plan.tp_size, plan.data_size, plan.hsdp) == ("fsdp2", 2, 2, 2, False)
    hsdp = make_plan("accelerate", DeviceMesh.from_sizes(tp_size=2, fsdp_size=2, dp_size=2), world_size=8)
    assert (hsdp.kind, hsdp.hsdp, hsdp.data_size) == ("fsdp2", True, 4)
    with pytest.raises(ValueError, match=r"DDP x tensor parallelism \(dp_size=2 x tp_size=2\).*fsdp_size=2"):
        make_plan("native_fsdp", DeviceMesh.from_sizes(tp_size=2, dp_size=2, world_size=4), world_size=4)
    with pytest.raises(ValueError, match=r"tp=2 = 4 processes but 2 were launched"):
        make_plan("native_fsdp", DeviceMesh.from_sizes(tp_size=2, fsdp_size=2, world_size=4), world_size=2)
    assert make_plan("native_fsdp", DeviceMesh.from_sizes(tp_size=2, world_size=2), world_size=2).kind == "tp"


def test_tp_refuses_a_model_without_a_plan_and_uneven_heads() -> None:
    import transformers
    from hf_testing import tiny_config

    from twinkle_hf.distributed.tensor_parallel import resolve_plan

    model = transformers.AutoModelForCausalLM.from_config(tiny_config("qwen2"))
    assert resolve_plan(model, 2)["model.layers.0.self_attn.o_proj"] == "rowwise"
    with pytest.raises(ValueError, match=r"tp_size=3 does not divide qwen2's num_attention_heads=4"):
        resolve_plan(model, 3)
    model._tp_plan = {}  # a family whose config declares no base_model_tp_plan
    with pytest.raises(ValueError, match=r"qwen2 model Qwen2ForCausalLM has no usable tensor-parallel plan.*"
                                         r"fsdp_size=2 instead of tp_size"):
        resolve_plan(model, 2)
    with pytest.raises(ValueError, match=r"not a transformers PreTrainedModel"):
        resolve_plan(torch.nn.Linear(2, 2), 2)


def test_multi_lora_refuses_tp_and_ep_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LoRA slots' row-routed forward is not written for tensor/expert-parallel layers: refused before loading."""
    from hf_testing import tiny_config

    from twinkle import DeviceMesh
    from twinkle.model import MultiLoraTransformersModel

    monkeypatch.setenv("WORLD_SIZE", "2")  # checked before the process group is
    with pytest.raises(ValueError, match=r"MultiLoraTransformersModel runs on dp and fsdp only: tp_size=2, "
                                         r"ep_size=1.*fsdp_size=2"):
        MultiLoraTransformersModel(config=tiny_config("qwen2"), device_mesh=DeviceMesh.from_sizes(tp_size=2))
