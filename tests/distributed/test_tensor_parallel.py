"""Tensor parallelism (tp=2 under torchrun, gloo) trains like one process: full fine-tuning and LoRA on a
tiny Qwen2, and full fine-tuning of a tiny Qwen3 (per-head q_norm/k_norm) with gradient accumulation.

One launch runs both scenarios of ``scripts/tp_job.py``; the reference is the same code in this process.

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
from rounding import Shape
from tp_job import ROWS, SEQ, STEPS, run

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)

SHAPE = Shape(hidden=64, intermediate=128, head_dim=16, layers=2, vocab=128, seq=SEQ, tokens=SEQ * ROWS)
BOUND = STEPS * SHAPE.step_bound()  # ~1.5e-4 relative
FORWARD = SHAPE.step_bound()  # one forward of the trained model (the export against the live model)
SCENARIOS = {"tp_full": {"lora": False}, "tp_lora": {"lora": True},
             "tp_qwen3_accum": {"lora": False, "family": "qwen3", "accumulation": 2}}
EXPORTED = ("tp_full", "tp_lora")


@pytest.fixture(scope="module")
def tp_job(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    out = tmp_path_factory.mktemp("tp_job")
    result = torchrun("tp_job.py", list(SCENARIOS), out, timeout=400)
    assert result.returncode == 0, f"torchrun tensor-parallel job failed:\n{result.output[-6000:]}"
    return result


@pytest.fixture(scope="module")
def references() -> dict:
    return {name: run(out=None, **kwargs) for name, kwargs in SCENARIOS.items()}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_tp2_matches_one_process(name: str, tp_job: JobResult, references: dict) -> None:
    want = references[name]
    ranks = [tp_job.load(name, r) for r in (0, 1)]
    scale = max((want["params"][k] - want["initial"][k]).abs().max().item() for k in want["params"])
    assert ranks[0]["losses"] == ranks[1]["losses"] and ranks[0]["grad_norms"] == ranks[1]["grad_norms"]
    for got in ranks:
        assert got["wrapped"] == "tp"
        assert got["losses"] == pytest.approx(want["losses"], rel=BOUND, abs=0)
        assert got["grad_norms"] == pytest.approx(want["grad_norms"], rel=BOUND, abs=0)
        assert sorted(got["params"]) == sorted(want["params"])
        for key, value in want["params"].items():  # the weight updates, relative to the largest one
            assert (got["params"][key] - value).abs().max().item() <= BOUND * scale, key
    # the comparison is not vacuous: SGD moved the weights far beyond the bound
    largest = max(want["initial"][k].abs().max().item() for k in want["params"])
    assert scale / largest > 100 * BOUND


def test_tp2_holds_half_of_the_decoder_layers(tp_job: JobResult, references: dict) -> None:
    """Per-rank parameter bytes of the decoder layers (the embedding and head dominate a tiny model)."""
    for name in SCENARIOS:
        for rank in (0, 1):
            got = tp_job.load(name, rank)["layer_bytes"]
            assert got <= 0.55 * references[name]["layer_bytes"], (name, got, references[name]["layer_bytes"])


@pytest.mark.parametrize("name", EXPORTED)
def test_tp2_state_and_export_are_full_tensors(name: str, tp_job: JobResult, references: dict) -> None:
    """get_state_dict gathers; the export loads in plain transformers (+ peft) with the live model's logits."""
    import transformers
    from hf_testing import tiny_config
    from peft import PeftModel

    got = tp_job.load(name, 0)
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


# ------------------------------------------------------------------ refusals (no launch)
def test_tp_with_fsdp_is_refused_naming_the_dimensions() -> None:
    from twinkle import DeviceMesh
    from twinkle_hf.distributed.plan import make_plan

    mesh = DeviceMesh.from_sizes(tp_size=2, fsdp_size=2, world_size=4)
    with pytest.raises(ValueError, match=r"tp_size=2 with dp_size=1 x fsdp_size=2.*tp_size=4.*fsdp_size=4"):
        make_plan("native_fsdp", mesh, world_size=4)
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
