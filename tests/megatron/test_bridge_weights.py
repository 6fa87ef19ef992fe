"""HF tensors -> megatron tensors -> TP shards -> back to HF: bit-identical, for every family.

These run on tensors only (no process groups); the torchrun test loads the shards into real
TP=2 models.
"""

from __future__ import annotations

import pytest
import torch
from megatron_testing import FAMILIES, hf_model, save_hf
from safetensors.torch import load_file

from twinkle_megatron.bridge.config import model_args
from twinkle_megatron.bridge.layout import convert_hf_to_mcore, convert_mcore_to_hf, fuse_qkv, model_names
from twinkle_megatron.bridge.shard import expert_range, layer_range, padded_vocab_size, shard, unshard
from twinkle_megatron.errors import MegatronConfigError


def _round_trip(hf_state, args, tp):
    padded = padded_vocab_size(args.vocab_size, tp)
    mcore = convert_hf_to_mcore(hf_state, args, padded)
    pieces = {n: [shard(n, t, r, tp) for r in range(tp)] for n, t in mcore.items()}
    rebuilt = {n: unshard(n, p) for n, p in pieces.items()}
    return mcore, pieces, convert_mcore_to_hf(rebuilt, args)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("tp", [1, 2])
def test_hf_to_megatron_shards_and_back_is_bit_identical(family, tp):
    model = hf_model(family)
    hf_state = {k: v.clone() for k, v in model.state_dict().items()}
    args = model_args(model.config)
    mcore, pieces, back = _round_trip(hf_state, args, tp)
    assert set(back) == set(hf_state)
    assert all(torch.equal(back[k], hf_state[k]) for k in hf_state)
    assert mcore["embedding.word_embeddings.weight"].shape[0] == padded_vocab_size(125, tp)
    if tp == 2:  # every TP rank holds half of each split tensor, whole query groups in linear_qkv
        qkv = pieces["decoder.layers.0.self_attention.linear_qkv.weight"]
        assert [p.shape[0] for p in qkv] == [64, 64]  # one group per rank: 2 q heads + k + v, 16 rows each
        assert [p.shape[1] for p in pieces["decoder.layers.0.self_attention.linear_proj.weight"]] == [32, 32]
        assert torch.equal(pieces["decoder.final_layernorm.weight"][1], hf_state["model.norm.weight"])


def test_qkv_layout_groups_query_heads_with_their_key_and_value():
    args = model_args(hf_model("qwen2").config)  # 4 heads, 2 groups, head_dim 16
    q, k, v = (torch.full((n * 16, 1), float(i)) for i, n in enumerate((4, 2, 2)))
    fused = fuse_qkv(q, k, v, args).flatten()
    group = [0.0] * 32 + [1.0] * 16 + [2.0] * 16  # q heads of the group, then its k, then its v
    assert fused.tolist() == group * 2


def test_gated_fc1_shards_hold_their_part_of_gate_and_up():
    full = torch.arange(8.0).reshape(8, 1)  # gate rows 0..3, up rows 4..7
    name = "decoder.layers.0.mlp.linear_fc1.weight"
    assert shard(name, full, 0, 2).flatten().tolist() == [0, 1, 4, 5]
    assert shard(name, full, 1, 2).flatten().tolist() == [2, 3, 6, 7]
    assert torch.equal(unshard(name, [shard(name, full, r, 2) for r in range(2)]), full)


def test_qwen3_moe_experts_split_over_expert_parallel_ranks(tmp_path):
    model = hf_model("qwen3_moe")
    files = load_file(str(save_hf(model, tmp_path) / "model.safetensors"))  # per-expert keys, as on the hub
    args = model_args(model.config)
    names = model_names(args, experts=expert_range(4, 1, 2))
    assert "decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight" in names
    assert not any("local_experts.0." in n or "local_experts.1." in n for n in names)
    mcore = convert_hf_to_mcore(files, args)
    back = convert_mcore_to_hf(mcore, args)
    assert set(back) == set(files) and all(torch.equal(back[k], files[k]) for k in files)
    fc1 = mcore["decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight"]
    assert torch.equal(fc1[:32], files["model.layers.0.mlp.experts.2.gate_proj.weight"])


def test_pipeline_and_expert_ranges_must_divide_evenly():
    assert list(layer_range(4, 1, 2)) == [2, 3]
    with pytest.raises(MegatronConfigError, match="num_hidden_layers=3 does not divide into pp_size=2"):
        layer_range(3, 0, 2)
    with pytest.raises(MegatronConfigError, match="num_experts=4 does not divide by ep_size=3"):
        expert_range(4, 0, 3)
