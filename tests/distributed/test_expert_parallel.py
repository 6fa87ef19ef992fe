"""Expert parallelism (FSDP2 x EP: fsdp=2, ep=2 under torchrun, gloo) trains like one process on a tiny Qwen 3.5
MoE (a Gated DeltaNet layer and a full-attention layer, 4 experts, top-2) and a tiny DeepSeek V3 (MLA, a dense
first layer, 4 routed experts and a shared one): full fine-tuning and LoRA; each rank holds half the experts.

One launch runs the scenarios of ``scripts/ep_job.py``; the reference is the same code in this process.

Bound: expert parallelism changes only the order of float32 sums (the dense gradients are averaged over the two
ranks by FSDP2, each expert's gradient adds the two ranks' tokens after the all-to-all, the grad norm adds per
tensor), so one step differs by ``Shape.step_bound()`` relative (tests/rounding.py). The reduction lengths of
the two models: hidden 64, the largest MLP 128 (DeepSeek's dense layer; an expert's is 32, the shared ones 32 and
48), head_dim 24 (MLA: 16 + 8 rotary), 2 layers, vocab 128, on 4 rows of 12 tokens; ``extra`` adds, per layer, the
terms the families have beyond a Llama layer -- the router (hidden), the shared expert (hidden + its 48), MLA's
low-rank q and kv projections (their 32 and 16 + 8) or the DeltaNet's projections and its chunked recurrence
(hidden + seq) -- bounded by 4 x hidden per layer. A routing decision flips only when two router logits lie
within that bound of each other. Under SGD the differences of successive steps add: ``STEPS`` times the bound.
"""

from __future__ import annotations

import pytest
from ep_job import ROWS, SEQ, STEPS, run
from launch import JobResult, torchrun
from rounding import Shape

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)

SHAPE = Shape(hidden=64, intermediate=128, head_dim=24, layers=2, vocab=128, seq=SEQ, tokens=SEQ * ROWS,
              extra=2 * 4 * 64)
BOUND = STEPS * SHAPE.step_bound()
SCENARIOS = {"ep_qwen3_5_moe_full": ("qwen3_5_moe", False), "ep_qwen3_5_moe_lora": ("qwen3_5_moe", True),
             "ep_deepseek_v3_full": ("deepseek_v3", False), "ep_deepseek_v3_lora": ("deepseek_v3", True)}


@pytest.fixture(scope="module")
def ep_job(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    out = tmp_path_factory.mktemp("ep_job")
    result = torchrun("ep_job.py", list(SCENARIOS), out, timeout=500)
    assert result.returncode == 0, f"torchrun expert-parallel job failed:\n{result.output[-6000:]}"
    return result


@pytest.fixture(scope="module")
def references() -> dict:
    return {name: run(*args) for name, args in SCENARIOS.items()}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_ep2_matches_one_process(name: str, ep_job: JobResult, references: dict) -> None:
    want = references[name]
    ranks = [ep_job.load(name, r) for r in (0, 1)]
    assert ranks[0]["losses"] == ranks[1]["losses"] and ranks[0]["grad_norms"] == ranks[1]["grad_norms"]
    scale = max((want["params"][k] - want["initial"][k]).abs().max().item() for k in want["params"])
    for got in ranks:
        assert (got["wrapped"], got["ep_size"]) == ("fsdp2", 2)
        assert got["losses"] == pytest.approx(want["losses"], rel=BOUND, abs=0)
        assert got["grad_norms"] == pytest.approx(want["grad_norms"], rel=BOUND, abs=0)
        assert sorted(got["params"]) == sorted(want["params"])
        for key, value in want["params"].items():  # the weight updates, relative to the largest one
            assert (got["params"][key] - value).abs().max().item() <= BOUND * scale, key
        assert got["state_is_full"] and got["state_keys"] == want["state_keys"]
    # the comparison is not vacuous: SGD moved the weights far beyond the bound
    largest = max(want["initial"][k].abs().max().item() for k in want["params"])
    assert scale / largest > 100 * BOUND
    if not SCENARIOS[name][1]:  # full fine-tuning trains the routed experts: they moved too
        moved = [k for k in want["params"] if ".mlp.experts." in k
                 and (want["params"][k] - want["initial"][k]).abs().max().item() > 100 * BOUND * scale]
        assert moved, "no routed expert weight was trained"


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_ep2_holds_half_of_the_experts(name: str, ep_job: JobResult, references: dict) -> None:
    """Per-rank bytes of the routed experts' weights, measured: at most 0.55 x one process's."""
    for rank in (0, 1):
        got = ep_job.load(name, rank)["expert_bytes"]
        assert 0 < got <= 0.55 * references[name]["expert_bytes"], (got, references[name]["expert_bytes"])


# ------------------------------------------------------------------ refusals (no launch)
def test_ep_refusals_name_the_family_the_dimension_and_the_fix() -> None:
    import torch
    import transformers
    from hf_testing import tiny_config

    from twinkle import DeviceMesh
    from twinkle_hf.distributed.expert_parallel import resolve_plan
    from twinkle_hf.distributed.plan import make_plan

    plan = make_plan("native_fsdp", DeviceMesh.from_sizes(fsdp_size=2, ep_size=2, world_size=2), world_size=2)
    assert (plan.kind, plan.ep_size, plan.data_size) == ("fsdp2", 2, 2)
    with pytest.raises(ValueError, match=r"expert x tensor parallelism \(ep_size=2 x tp_size=2\)"):
        make_plan("native_fsdp", DeviceMesh.from_sizes(fsdp_size=2, tp_size=2, ep_size=2), world_size=4)
    with pytest.raises(ValueError, match=r"under FSDP2 only: ep_size=2 with dp_size=2 x fsdp_size=1.*fsdp_size=2"):
        make_plan("native_fsdp", DeviceMesh.from_sizes(dp_size=2, ep_size=2), world_size=2)
    dense = transformers.AutoModelForCausalLM.from_config(tiny_config("qwen2"))
    with pytest.raises(ValueError, match=r"ep_size=2: the qwen2 model Qwen2ForCausalLM has no usable expert-parallel "
                                         r"plan.*fsdp_size=2 instead of ep_size"):
        resolve_plan(dense, 2)
    from ep_job import config

    torch.manual_seed(0)
    moe = transformers.AutoModelForCausalLM.from_config(config("qwen3_5_moe"))
    assert resolve_plan(moe, 2)["model.layers.1.mlp.experts"] == "ep_dispatch_experts"
    with pytest.raises(ValueError, match=r"ep_size=3 does not divide qwen3_5_moe_text's 4 experts"):
        resolve_plan(moe, 3)
