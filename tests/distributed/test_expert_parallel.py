"""Expert parallelism (FSDP2 x EP: fsdp=2, ep=2 under torchrun, gloo) trains like one process on a tiny Qwen 3.5
MoE (a Gated DeltaNet layer and a full-attention layer, 4 experts, top-2) and a tiny DeepSeek V3 (MLA, a dense
first layer, 4 routed experts and a shared one): full fine-tuning and LoRA; each rank holds half the experts.
On 4 ranks (fsdp=4 x ep=2) FSDP2 also shards the experts over the 2 ranks holding the same ones: a quarter each.

Two launches (2 and 4 ranks) run the scenarios of ``scripts/ep_job.py``; the reference is the same code in this
process.

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
EP2 = {"ep_qwen3_5_moe_full": ("qwen3_5_moe", False), "ep_qwen3_5_moe_lora": ("qwen3_5_moe", True),
       "ep_deepseek_v3_full": ("deepseek_v3", False), "ep_deepseek_v3_lora": ("deepseek_v3", True)}
FSDP4_EP2 = {"fsdp4_ep2_qwen3_5_moe_full": ("qwen3_5_moe", False), "fsdp4_ep2_deepseek_v3_lora": ("deepseek_v3", True)}
SCENARIOS = {**EP2, **FSDP4_EP2}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, JobResult]:
    """{ranks: its launch}: fsdp=2 x ep=2 on 2 ranks, fsdp=4 x ep=2 on 4."""
    out = tmp_path_factory.mktemp("ep_job")
    launched = {2: torchrun("ep_job.py", list(EP2), out, timeout=500),
                4: torchrun("ep_job.py", list(FSDP4_EP2), out, nproc=4, timeout=500)}
    for nproc, result in launched.items():
        assert result.returncode == 0, f"torchrun expert-parallel job ({nproc} ranks) failed:\n{result.output[-6000:]}"
    return launched


def ranks_of(name: str) -> int:
    return 4 if name in FSDP4_EP2 else 2


@pytest.fixture(scope="module")
def references() -> dict:
    """One process; every rank count shares the reference of the same model and adapters."""
    want = {args: run(*args) for args in set(SCENARIOS.values())}
    return {name: want[args] for name, args in SCENARIOS.items()}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_ep2_matches_one_process(name: str, jobs: dict, references: dict) -> None:
    want = references[name]
    ranks = [jobs[ranks_of(name)].load(name, r) for r in range(ranks_of(name))]
    assert all(r["losses"] == ranks[0]["losses"] and r["grad_norms"] == ranks[0]["grad_norms"] for r in ranks)
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
def test_ep2_holds_half_of_the_experts(name: str, jobs: dict, references: dict) -> None:
    """Per-rank bytes of the routed experts' weights, measured: at most 0.55 x one process's at ep=2, and half
    of that again at fsdp=4 x ep=2 (FSDP2 shards them over the 2 ranks holding the same experts)."""
    nproc = ranks_of(name)
    for rank in range(nproc):
        got = jobs[nproc].load(name, rank)["expert_bytes"]
        limit = 0.55 * references[name]["expert_bytes"] * 2 / nproc
        assert 0 < got <= limit, (got, references[name]["expert_bytes"])


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
