"""Megatron column of the family matrix: the bridge's logits equal HF's at TP=1 (here) and TP=2 (one torchrun
launch, started with the package's first test so it runs while the in-process tests do: conftest.py); seed 001's
MegatronModel example on a Qwen 3.5 model trains at TP=2 with the losses of TP=1; every family megatron-core
cannot build on CPU is refused before any weight is read, naming the family and the measured reason.

CPU variants (docs/models.md): Qwen 3.5 with all layers full attention (Gated DeltaNet layers need megatron's
TE + FLA spec on a GPU and are not mapped); DeepSeek R1 with dense layers only (megatron-core's MoE layers
need CUDA + Transformer Engine), with plain and YaRN rope. Tolerances (tests/rounding.py): TP splits the
matrix products, so only float32 summation order differs from HF / TP=1; the logits within a forward's bound of
the families' largest shape, elementwise as ``within`` scales it by the largest logit; the example's losses and
adapters (Adam with eps 1: family_testing.SEED_PARITY_OPTIMIZER) within 3 steps' bound, the adapters per tensor
by norm and shown to move far beyond it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from family_testing import (
    FAMILIES,
    MEGATRON_CPU,
    SEED_ACCUMULATION,
    SEED_BATCHES,
    SEED_PARITY_OPTIMIZER,
    SEED_TOKENS,
    deepseek_v3_config,
    logits_batch,
    max_logits_diff,
    qwen3_5_config,
    qwen3_5_moe_config,
    seed_example,
    seeded_model,
)
from rounding import LORA_TERMS, Shape, U, within
from safetensors.torch import load_file

from twinkle_megatron.bridge.config import model_args
from twinkle_megatron.bridge.layout import convert_hf_to_mcore, convert_mcore_to_hf
from twinkle_megatron.bridge.shard import padded_vocab_size, shard, unshard
from twinkle_megatron.errors import MegatronConfigError

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)

#: logits_batch (2 rows of 20 tokens) through the largest MEGATRON_CPU model: hidden 64, MLP 128, 2 layers, the
#: scores over DeepSeek's 16 + 8 query dims, its MLA low-rank projections and their norms (q 64 -> 32 -> heads,
#: kv 64 -> 16 -> heads: < 256 terms a layer, ``extra``); the vocabulary of the embedded tokenizer and the
#: families' added tokens (< 2700; a logit sums none of it, the bound counts it anyway)
LOGITS = Shape(hidden=64, intermediate=128, head_dim=24, layers=2, vocab=2700, seq=20, tokens=40, extra=512)
#: One step of the example: micro-batches of 2 rows of at most SEED_TOKENS tokens, the gradient summed over the
#: window's SEED_ACCUMULATION of them, a rank-4 LoRA on every linear of Qwen 3.5's two layers (its query gate
#: is rows of q_proj: no longer a path)
SEED_STEP = Shape(hidden=64, intermediate=128, head_dim=16, layers=2, vocab=2700, seq=SEED_TOKENS,
                  tokens=SEED_ACCUMULATION * 2 * SEED_TOKENS, extra=LORA_TERMS)
SEED_STEPS = SEED_BATCHES // SEED_ACCUMULATION
#: step k carries the k - 1 earlier steps' rounding twice (Adam's Lipschitz constant, eps 1) and its own
SEED_BOUND = (2 * (SEED_STEPS - 1) + 1) * SEED_STEP.step_bound()


def logits_room(scale: float) -> float:
    """``within``'s atol + rtol * |want| at the largest logit ``scale``: what a logit may differ by."""
    room = within(LOGITS.forward_bound(), torch.tensor(scale))
    return room["atol"] + room["rtol"] * scale


def megatron(path: Path, **kwargs):
    from twinkle.model import MegatronModel

    return MegatronModel(model_id=str(path), mixed_precision="no", **kwargs)


@pytest.mark.parametrize("name", list(MEGATRON_CPU))
def test_megatron_logits_match_hf_at_tp1(tp2, megatron_dirs, name):
    model = megatron(megatron_dirs[name])
    key = MEGATRON_CPU[name][0]
    assert model.hf_config.architectures[0] == FAMILIES[key].architecture
    batch = logits_batch()
    got = max_logits_diff(model.forward_only(inputs=batch)["logits"], megatron_dirs[name], batch)
    print(f"{name}: max logit diff {got['diff']:.2e}, room {logits_room(got['scale']):.2e}, scale {got['scale']:.3f}")
    assert got["diff"] <= logits_room(got["scale"]), got
    assert logits_room(got["scale"]) < 1e-2 * got["scale"]  # a mistake (a lost term, row or scale) moves ~scale


def test_megatron_logits_match_hf_at_tp2(tp2, megatron_dirs):
    for rank, report in enumerate(tp2.reports()):
        for name, path in megatron_dirs.items():
            got = report[f"{name}_logits"]
            assert got["diff"] <= logits_room(got["scale"]), (name, rank, got)
            vocab = model_args(_config(path)).vocab_size
            assert report[f"{name}_vocab_rows"] == padded_vocab_size(vocab, 2) // 2  # each rank its half


def test_seed_megatron_example_trains_at_tp2_like_tp1(tp2, megatron_dirs, tmp_path):
    """Seed 001's example with a Qwen 3.5 config: constructs, trains (LoRA, accumulation 2) at TP=2 on 2 CPU
    ranks with TP=1's losses, and the adapters saved at TP=1 and TP=2 agree."""
    single = seed_example(megatron_dirs["qwen3_5"], tmp_path, **SEED_PARITY_OPTIMIZER)
    assert len(single["losses"]) == SEED_BATCHES and single["steps"] == SEED_STEPS
    assert single["losses"][-1] < single["losses"][0]
    for report in tp2.reports():
        assert report["seed"]["steps"] == single["steps"]
        print(f"losses TP=2 {report['seed']['losses']} vs TP=1 {single['losses']}, bound {SEED_BOUND:.2e} rel")
        assert report["seed"]["losses"] == pytest.approx(single["losses"], rel=SEED_BOUND, abs=0)
    ours = load_file(str(Path(tp2.reports()[0]["seed"]["saved"]) / "adapter_model.safetensors"))
    reference = load_file(str(Path(single["saved"]) / "adapter_model.safetensors"))
    initial = load_file(str(Path(single["initial"]) / "adapter_model.safetensors"))
    assert set(ours) == set(reference) == set(initial)
    assert any("q_proj.lora_B" in k for k in reference)  # the gated q_proj (query and gate rows) is adapted
    worst = 0.0
    for key in reference:
        update = float((reference[key] - initial[key]).norm())
        # the bound times the update, plus float32 storage of each step's weight (u |w| per step)
        room = SEED_BOUND * update + SEED_STEPS * U * float(reference[key].norm())
        diff = float((ours[key] - reference[key]).norm())
        worst = max(worst, diff / room)
        assert diff <= room, key
        if ".lora_B." in key:  # zero at the start: the steps moved it far beyond the room, so this could fail
            assert update > 100 * room, key
    print(f"adapters TP=2 vs TP=1: largest difference {worst:.2e} of its room")


def _config(path: Path):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(path))


ROUND_TRIP = {
    "qwen3_5": lambda: qwen3_5_config(300, full_attention_only=True),
    "qwen3_5_moe": lambda: qwen3_5_moe_config(300, full_attention_only=True),
    "deepseek_r1": lambda: deepseek_v3_config(300),
    "deepseek_r1_dense": lambda: deepseek_v3_config(300, dense_only=True),
}


@pytest.mark.parametrize("name", list(ROUND_TRIP))
@pytest.mark.parametrize("tp", [1, 2])
def test_hf_to_megatron_and_back_is_bit_identical(name, tp, tmp_path):
    """Every tensor of the new mappings (gated q/k/v, zero-centred norms, MLA, routers with correction bias, shared
    experts and their gate), split over TP and put back: the MoE ones are checked here, as they cannot run on CPU."""
    model = seeded_model(ROUND_TRIP[name]())
    model.save_pretrained(str(tmp_path))
    hf = load_file(str(tmp_path / "model.safetensors"))  # the file keys (per-expert tensors), as on the hub
    args = model_args(model.config)
    mcore = convert_hf_to_mcore(hf, args, padded_vocab_size(args.vocab_size, tp))
    rebuilt = {n: unshard(n, [shard(n, t, r, tp) for r in range(tp)]) for n, t in mcore.items()}
    back = convert_mcore_to_hf(rebuilt, args)
    assert set(back) == set(hf)
    assert all(torch.equal(back[k], hf[k]) for k in hf)


def test_moe_family_mappings_name_megatrons_routing(tmp_path):
    """The MoE semantics written for GPU: Qwen3.5-MoE renormalised softmax + gated shared expert; DeepSeek sigmoid
    routing with the correction bias (not updated), group-limited top-k, scaling, shared experts, dense first layer."""
    qwen = model_args(qwen3_5_moe_config(300, full_attention_only=True)).moe
    assert qwen["moe_router_pre_softmax"] is False and qwen["moe_shared_expert_gate"] is True
    assert qwen["moe_shared_expert_intermediate_size"] == 48
    deepseek = model_args(deepseek_v3_config(300)).moe
    assert deepseek["moe_layer_freq"] == [0, 1] and deepseek["moe_router_score_function"] == "sigmoid"
    assert deepseek["moe_router_enable_expert_bias"] and deepseek["moe_router_bias_update_rate"] == 0.0
    assert (deepseek["moe_router_num_groups"], deepseek["moe_router_group_topk"]) == (2, 1)
    assert deepseek["moe_router_topk_scaling_factor"] == 2.5 and deepseek["moe_shared_expert_intermediate_size"] == 32
    assert model_args(deepseek_v3_config(300, dense_only=True)).moe == {}  # no expert layer: a dense model
    with pytest.raises(MegatronConfigError, match="top-2"):
        model_args(deepseek_v3_config(300, n_routed_experts=8, n_group=2, topk_group=1, num_experts_per_tok=4))


def test_families_megatron_cannot_build_on_cpu_are_refused_naming_them(family_dirs, tmp_path):
    """Before any process group or weight: each refusal names the family and the reason."""
    from family_testing import write_model
    from transformers import AutoConfig

    refusals = {
        "qwen3_5": r"Qwen3_5ForCausalLM: layers \[0\] are 'linear_attention' \(Gated DeltaNet\).*FLA",
        "qwen3_5_moe": r"Qwen3_5MoeForCausalLM: layers \[0\] are 'linear_attention'",
        "deepseek_r1": r"DeepseekV3ForCausalLM is a mixture-of-experts model: .*CUDA and Transformer Engine",
        "deepseek_v4": r"DeepSeek V4 \(DeepseekV4ForCausalLM\) has no megatron-core 0.16 counterpart",
        "glm4": r"GLM-4 \(GlmForCausalLM\) is not mapped",
        "internlm2_5": r"InternLM2 / InternLM2.5 .* is not mapped",
    }
    for key, pattern in refusals.items():
        config = AutoConfig.from_pretrained(str(family_dirs[key]), trust_remote_code=FAMILIES[key].remote_model)
        with pytest.raises(MegatronConfigError, match=pattern):
            megatron(family_dirs[key], config=config)
    moe_dir = write_model(FAMILIES["qwen3_5_moe"], tmp_path / "moe",
                          config=qwen3_5_moe_config(300, full_attention_only=True))  # vocab set from the tokenizer
    with pytest.raises(MegatronConfigError, match="Qwen3_5MoeForCausalLM is a mixture-of-experts model"):
        megatron(moe_dir)
