"""Two gloo processes (one torchrun launch): TP=2 and DP=2 against single-process (TP=1) runs and HF/peft.

Launched by the session fixture ``launches`` (conftest.py) together with the simulated-CUDA run; the
TP=1 references run here, in this process, on the same checkpoints and batches.

Tolerances: logits within a forward's float32 bound (TP splits matrix products, only summation order changes;
tests/rounding.py, relative to the largest logit as ``within`` scales it); losses, grad norms and weight updates
of 5 training steps
(AdamW with eps = 1, Lipschitz in the gradient: megatron_testing.ADAM_EPS) within ``BOUND``, float32's
bound for 5 steps of the tiny model on 4 rows of 12 tokens (tests/rounding.py, as tests/distributed/
dist_bounds.py derives it), the weights compared per tensor by norm and shown to move far beyond it;
weights that were only split and gathered, bit-identical.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from megatron_testing import (
    VOCAB,
    VOCAB_LARGE,
    lora_config,
    loss_peak_bytes,
    make_batch,
    megatron_model,
    rows,
    train,
    train_batches,
)
from rounding import LORA_TERMS, U, tiny_hf
from safetensors.torch import load_file

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)

#: the logit checks' forward (3 rows of <= 12 tokens, a LoRA, Qwen3's q/k norms over head_dim 16): each logit
#: within rtol + atol of within(), both relative to the largest logit (the scripts report diff / max |logit|)
LOGITS_REL = tiny_hf(12, 4, vocab=VOCAB, extra=LORA_TERMS + 2 * 2 * 16).forward_bound() * (1 + 128**0.5)
#: the lm_head LoRA's gradients (4 rows of <= 12 tokens), relative to the largest as the scripts report them
GRAD_REL = tiny_hf(12, 4, vocab=VOCAB, extra=LORA_TERMS).step_bound() * (1 + 128**0.5)
#: the returned loss of one forward of train_batches()[0] (4 rows of <= 12 tokens), and the vocabulary-parallel
#: loss of 2 rows of 64 tokens over VOCAB_LARGE: a forward's float32 bound each (tests/rounding.py)
LOSS_REL = tiny_hf(12, 4, vocab=VOCAB).forward_bound()
LARGE_LOSS_REL = tiny_hf(64, 2, vocab=VOCAB_LARGE).forward_bound()
#: step k carries the k - 1 earlier steps' rounding twice (Adam's Lipschitz constant) and its own
BOUND = (2 * (5 - 1) + 1) * tiny_hf(12, 4, extra=LORA_TERMS).step_bound()


@pytest.fixture(scope="module")
def reports(launches):
    launch, out = launches["tp2"]
    code, stdout, stderr = launch.wait()
    (out / "stderr.log").write_text(stderr)
    errors = "\n".join(line for line in stderr.splitlines() if "Error" in line)
    assert code == 0, f"{errors[-3000:]}\n...\n{stderr[-3000:]}\n(full log: {out / 'stderr.log'})"
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.fixture(scope="module")
def single(launches, tmp_path_factory):
    """The TP=1 references, in this process: the same training runs, the same large-vocabulary loss."""
    out = tmp_path_factory.mktemp("tp1")
    ref = {}
    full = megatron_model(launches["qwen3"])
    ref["full"] = train(full, train_batches())
    ref["full_saved"] = full.save("tp1-full", output_dir=str(out))
    lora = megatron_model(launches["qwen2"])
    lora.add_adapter_to_model("a", lora_config())
    ref["lora_initial"] = lora.save("tp1-lora-initial", output_dir=str(out), adapter_name="a")
    ref["lora"] = train(lora, train_batches(), adapter="a")
    ref["lora_saved"] = lora.save("tp1-lora", output_dir=str(out), adapter_name="a")
    large = megatron_model(launches["large"])
    large.set_optimizer("default", lr=1e-3)
    ref["large_loss"], ref["large_loss_peak_bytes"] = loss_peak_bytes(
        large, make_batch(seed=11, rows=2, length=64, vocab=VOCAB_LARGE))
    ref["large_token_accuracy"] = large.calculate_metric(True)["token_accuracy"]
    return ref


def _initial(launches, single, kind: str) -> dict:
    if kind == "full":
        return load_file(str(launches["qwen3"] / "model.safetensors"))
    return load_file(str(Path(single["lora_initial"]) / "adapter_model.safetensors"))


def _room(trained, start) -> float:
    """Per tensor: the bound times the update, plus float32 storage of each step's weight (u |w| per step)."""
    return BOUND * float((trained - start).norm()) + 5 * U * float(trained.norm())


def _same_files(ours: str, ref: str, name: str, start: dict) -> None:
    a, b = load_file(str(Path(ours) / name)), load_file(str(Path(ref) / name))
    assert set(a) == set(b)
    for key in b:
        assert a[key].shape == b[key].shape and a[key].dtype == b[key].dtype, key
        diff, room = float((a[key] - b[key]).norm()), _room(b[key], start[key])
        print(f"{name} {key}: diff {diff:.2e} of {room:.2e}") if diff > room / 10 else None
        assert diff <= room, (key, diff, room)


def _column(steps: list[dict], key: str) -> list[float]:
    return [s[key] for s in steps]


# ------------------------------------------------------------------------------ layout (forward, weights)
def test_each_rank_holds_half_the_padded_vocabulary(reports):
    assert [r["tp_rank"] for r in reports] == [0, 1]
    assert [r["vocab_rows_on_this_rank"] for r in reports] == [63, 63]  # 125 padded to 126, split in two


@pytest.mark.parametrize("key", ["qwen2_logits_diff", "qwen3_logits_diff", "lora_logits_diff"])
def test_tp2_logits_match_the_hf_reference(reports, key):
    assert all(r[key] <= LOGITS_REL for r in reports), [r[key] for r in reports]


def test_weights_and_adapters_survive_tp2_bit_identically(reports):
    for r in reports:
        assert r["export_bit_identical"] and r["saved_bit_identical"] and r["adapter_bit_identical"]
        assert r["saved_reload_logits_diff"] == 0.0


def test_megatron_groups_are_the_mesh_groups(reports):
    for rank, r in enumerate(reports):
        assert r["groups_tp2"] == {"tp": [0, 1], "dp": [rank]} and r["mesh_tp_group"] == [0, 1]
        assert r["groups_dp2"] == {"tp": [rank], "dp": [0, 1]} and r["mesh_dp_group"] == [0, 1]


# ------------------------------------------------------------------------------ training on two CPU ranks
@pytest.mark.parametrize("layout", ["tp2", "dp2"])
@pytest.mark.parametrize("kind", ["full", "lora"])
def test_five_steps_give_the_single_process_losses_and_files(launches, reports, single, layout, kind):
    reference = single[kind]
    for r in reports:
        steps = r[f"{layout}_{kind}"]
        print(f"{layout} {kind}: losses {_column(steps, 'loss')} vs TP=1 {_column(reference, 'loss')}, max diff "
              f"{max(abs(a - b) for a, b in zip(_column(steps, 'loss'), _column(reference, 'loss'))):.2e}")
        assert _column(steps, "loss") == pytest.approx(_column(reference, "loss"), rel=BOUND, abs=0)
        assert _column(steps, "grad_norm") == pytest.approx(_column(reference, "grad_norm"), rel=BOUND, abs=0)
        assert _column(steps, "token_accuracy") == _column(reference, "token_accuracy")
    name = "model.safetensors" if kind == "full" else "adapter_model.safetensors"
    _same_files(reports[0][f"{layout}_{kind}_saved"], single[f"{kind}_saved"], name, _initial(launches, single, kind))


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_the_compared_runs_moved_the_weights_far_beyond_the_tolerance(launches, single, kind):
    trained = load_file(str(Path(single[f"{kind}_saved"]) / ("model.safetensors" if kind == "full"
                                                              else "adapter_model.safetensors")))
    start = _initial(launches, single, kind)
    for key in start:  # every compared matrix: its update far beyond the room it is given (norm weights of ~1,
        update = float((trained[key] - start[key]).norm())  # moved by Adam's lr g / (|g| + 1), less: compared only)
        assert update > 10 * _room(trained[key], start[key]) or trained[key].ndim == 1, (key, update)


def test_tp2_resume_from_a_checkpoint_continues_bitwise(reports):
    for rank, r in enumerate(reports):
        assert {f"optimizer_{rank}.pt", f"rng_state_{rank}.pt", "model.safetensors"} <= set(r["tp2_resume_files"])
        assert r["tp2_resume_head"] + r["tp2_resume_tail"] == r["tp2_full"]


@pytest.mark.parametrize("path", ["eager", "scheduled"])
def test_the_returned_loss_is_the_mean_over_the_data_ranks(launches, reports, path):
    """Each rank trains on its half of the rows; the loss forward_backward returns on every rank is the one-process
    loss of the whole batch (the halves' own losses are far from it)."""
    whole = train_batches()[0]
    own = []
    for batch in (whole, rows(whole, 0, 2), rows(whole, 1, 2)):
        model = megatron_model(launches["qwen2"])
        model.set_optimizer("default", lr=1e-3)
        own.append(float(model.forward_backward(inputs=batch)))
    reference, halves = own[0], own[1:]
    assert [r[f"dp2_{path}_returned_loss"] for r in reports] == pytest.approx([reference] * 2, rel=LOSS_REL, abs=0)
    assert all(abs(h - reference) > 10 * LOSS_REL * reference for h in halves)


def test_cpu_driver_sums_tokens_and_gradients_over_data_and_context_ranks(reports):
    # rank r holds gradient sum (r + 1) over 2 + 4r tokens: the mean is (1 + 2) / (2 + 6) on both ranks
    assert [r["cp_grad_after_finalize"] for r in reports] == [[0.375] * 3] * 2


# ------------------------------------------------------------------------------ vocabulary-parallel loss
def test_vocab_parallel_loss_equals_the_single_process_loss(reports, single):
    print(f"large-vocabulary loss: TP=2 {[r['large_loss'] for r in reports]} vs TP=1 {single['large_loss']}")
    for r in reports:
        assert r["large_logit_columns_on_this_rank"] == (VOCAB_LARGE + 1) // 2
        assert r["large_loss"] == pytest.approx(single["large_loss"], rel=LARGE_LOSS_REL, abs=0)
        assert r["large_token_accuracy"] == single["large_token_accuracy"]
        assert r["large_custom_loss"] == pytest.approx(single["large_loss"], rel=LARGE_LOSS_REL, abs=0)


def test_vocab_parallel_loss_needs_about_half_the_memory(reports, single):
    ratios = [r["large_loss_peak_bytes"] / single["large_loss_peak_bytes"] for r in reports]
    print(f"loss peak bytes: TP=1 {single['large_loss_peak_bytes']}, "
          f"TP=2 {[r['large_loss_peak_bytes'] for r in reports]}, ratios {ratios}")
    assert all(0.4 <= ratio <= 0.6 for ratio in ratios), ratios


# ------------------------------------------------------------------------------ LoRA on lm_head (vocabulary-parallel B)
@pytest.mark.parametrize("tag", ["lm_head", "lm_head_tied"])
def test_lm_head_lora_at_tp2_gives_pefts_logits_gradients_and_files(reports, tag):
    """B is split over the padded vocabulary (125 -> 2 x 63): rank 1's last row is padding, which never trains and
    never reaches the file; a peft-saved adapter (with its base lm_head copy) loads and saves back bit for bit."""
    print(f"{tag}: logits diff {[r[f'{tag}_logits_diff'] for r in reports]}, gradient rel diff "
          f"{[r[f'{tag}_grad_rel_diff'] for r in reports]}, gather diff {[r[f'{tag}_gather_diff'] for r in reports]}")
    for r in reports:
        assert r[f"{tag}_logits_diff"] <= LOGITS_REL
        # the largest gradient difference relative to the largest gradient: a step's bound, as within() scales it
        assert r[f"{tag}_grad_keys"] == ["lm_head", "lm_head"] and r[f"{tag}_grad_rel_diff"] <= GRAD_REL
        assert r[f"{tag}_adapter_bit_identical"]
        assert r[f"{tag}_gather_diff"] == 0.0 and r[f"{tag}_gathered_width"] == 126
        assert r[f"{tag}_padding_zero"] == [True, True, True]  # zero, no gradient; real rows learn; zero after a step
    assert [r[f"{tag}_padded_rows"] for r in reports] == [0, 1]
