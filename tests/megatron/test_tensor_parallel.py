"""TP=2 on two gloo processes (one torchrun launch): logits, weights, saving and LoRA against the HF/peft references.

Launched by the session fixture ``launches`` (conftest.py) together with the simulated-CUDA run.
The same tolerance as at TP=1 (2e-5 in fp32): TP splits matrix products, so only summation order
changes. Weights must come back bit-identical after being split over two ranks and gathered.
"""

from __future__ import annotations

import json

import pytest

ATOL = 2e-5


@pytest.fixture(scope="module")
def reports(launches):
    launch, out = launches["tp2"]
    code, stdout, stderr = launch.wait()
    assert code == 0, stdout[-2000:] + stderr[-4000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_each_rank_holds_half_the_padded_vocabulary(reports):
    assert [r["tp_rank"] for r in reports] == [0, 1]
    assert [r["vocab_rows_on_this_rank"] for r in reports] == [63, 63]  # 125 padded to 126, split in two


@pytest.mark.parametrize("key", ["qwen2_logits_diff", "qwen3_logits_diff", "lora_logits_diff"])
def test_tp2_logits_match_the_hf_reference(reports, key):
    assert all(r[key] <= ATOL for r in reports), [r[key] for r in reports]


def test_weights_and_adapters_survive_tp2_bit_identically(reports):
    for r in reports:
        assert r["export_bit_identical"] and r["saved_bit_identical"] and r["adapter_bit_identical"]
        assert r["saved_reload_logits_diff"] == 0.0


def test_megatron_groups_are_the_mesh_groups(reports):
    for rank, r in enumerate(reports):
        assert r["groups_tp2"] == {"tp": [0, 1], "dp": [rank]} and r["mesh_tp_group"] == [0, 1]
        assert r["groups_dp2"] == {"tp": [rank], "dp": [0, 1]} and r["mesh_dp_group"] == [0, 1]


def test_cpu_training_on_two_processes_is_refused_with_the_reason(reports):
    assert all(r["cpu_training_refused"] for r in reports)
