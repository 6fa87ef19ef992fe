"""Sequence parallelism (cp=2 under torchrun, gloo) trains like one process: full fine-tuning and LoRA, padded
and packed rows, sdpa and eager attention (one key/value head for two ranks), a tiny Qwen2 and Qwen3; each rank
saves about half the activations of one process on a 4096-token row; the Trainer trains with ``sp_size=2``.

One launch runs every scenario of ``scripts/sp_job.py``; the reference is the same code in this process.

Bound: the split changes only the order of float32 sums (a rank sums half of a row's token losses and half of
each weight gradient's terms, which DDP then adds; attention sees the same keys, with the same mask), so two
runs differ by the rounding of one step, ``Shape.step_bound()`` relative (tests/rounding.py), for the tiny
models of ``hf_testing.tiny_config`` (hidden 64, MLP 128, head_dim 16, 2 layers, vocab 128) on one packed row of
all ``ROWS * SEQ`` tokens (the longest softmax; padded rows are shorter), plus the LoRA terms. Under SGD the
differences of successive steps add (tests/golden/golden_bounds.py): ``STEPS`` times that bound for losses,
grad norms and weight updates.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from launch import JobResult, torchrun
from rounding import LORA_TERMS, Shape, tiny_qwen
from sp_job import MEMORY_TOKENS, ROWS, SCENARIOS, SEQ, STEPS, TRAINER_JOB, TRAINER_STEPS, trainer

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)

SHAPE = Shape(hidden=64, intermediate=128, head_dim=16, layers=2, vocab=128, seq=ROWS * SEQ, tokens=ROWS * SEQ,
              extra=LORA_TERMS)
BOUND = STEPS * SHAPE.step_bound()  # ~1.6e-4 relative
TRAINING = [name for name in SCENARIOS if name.startswith("sp_")]


@pytest.fixture(scope="module")
def sp_job(tmp_path_factory: pytest.TempPathFactory) -> JobResult:
    out = tmp_path_factory.mktemp("sp_job")
    result = torchrun("sp_job.py", list(SCENARIOS), out, timeout=500, env={"TQDM_DISABLE": "1"})
    assert result.returncode == 0, f"torchrun sequence-parallel job failed:\n{result.output[-6000:]}"
    return result


@pytest.fixture(scope="module")
def references() -> dict:
    return {name: SCENARIOS[name]() for name in [*TRAINING, "memory"]}


@pytest.mark.parametrize("name", TRAINING)
def test_sp2_matches_one_process(name: str, sp_job: JobResult, references: dict) -> None:
    want = references[name]
    ranks = [sp_job.load(name, r) for r in (0, 1)]
    scale = max((want["params"][k] - want["initial"][k]).abs().max().item() for k in want["params"])
    assert ranks[0]["losses"] == ranks[1]["losses"] and ranks[0]["grad_norms"] == ranks[1]["grad_norms"]
    for got in ranks:
        assert got["split"] and not want["split"] and got["wrapped"] == "ddp" and got["attn"] == want["attn"]
        assert got["losses"] == pytest.approx(want["losses"], rel=BOUND, abs=0)
        assert got["grad_norms"] == pytest.approx(want["grad_norms"], rel=BOUND, abs=0)
        assert sorted(got["params"]) == sorted(want["params"])
        for key, value in want["params"].items():  # the weight updates, relative to the largest one
            assert (got["params"][key] - value).abs().max().item() <= BOUND * scale, key
    # the comparison is not vacuous: SGD moved the weights far beyond the bound
    largest = max(want["initial"][k].abs().max().item() for k in want["params"])
    assert scale / largest > 100 * BOUND


def test_packed_rows_attend_within_their_sequence(references: dict) -> None:
    """Packing the padded rows of the first step into one row leaves its loss as it was (before any update; a
    LoRA adapter starts as the identity): no token attends across a sequence boundary, on one process. The sp2
    runs equal these one-process losses (above), so the split keeps the boundaries too."""
    padded, packed = references["sp_full_padded"]["losses"][0], references["sp_lora_packed"]["losses"][0]
    assert packed == pytest.approx(padded, rel=SHAPE.forward_bound(), abs=0)


def test_sp2_saves_at_most_0_6_of_one_process_activations(sp_job: JobResult, references: dict) -> None:
    """Bytes of the tensors a training forward of one 4096-token row saves for backward (parameters excluded)."""
    want = references["memory"]["activation_bytes"]
    for rank in (0, 1):
        got = sp_job.load("memory", rank)["activation_bytes"]
        assert got <= 0.6 * want, (got, want, got / want)
    assert want > MEMORY_TOKENS * 64 * 4 * 2 * 10  # the reference really saved per-token activations of every layer


def test_trainer_with_sp_size_2_trains_like_one_process(sp_job: JobResult, tmp_path) -> None:
    """xtuner's ``sp_size=2`` on 2 ranks: packed micro-batches split over the two, activation checkpointing on,
    the final loss, the evaluation loss and adapter weights equal to one process's.

    Bound for the weights: SGD's update is lr * g with g clipped to max_grad_norm; each element of g differs by
    at most ``rel * sqrt(terms) * max|g|`` (tests/rounding.py, ``within``) with ``max|g| <= max_grad_norm``, and
    the steps' differences add.
    """
    want = trainer(None, work_dir=tmp_path / "reference")
    shape = tiny_qwen(seq=128, rows=4)  # the tiny job's max_length and rows per micro-batch
    rel = TRAINER_STEPS * shape.step_bound()
    optimizer = TRAINER_JOB["optimizer"]
    bound = rel * math.sqrt(shape.tokens) * optimizer["lr"] * optimizer["max_grad_norm"]
    for rank in (0, 1):
        got = sp_job.load("trainer", rank)
        assert got["split"] and not want["split"] and got["step"] == want["step"] == TRAINER_STEPS
        assert got["checkpointing"] and want["checkpointing"]
        assert got["final_loss"] == pytest.approx(want["final_loss"], rel=rel, abs=0)
        assert got["eval_loss"] is not None  # the evaluation of the trained weights: one more forward
        assert got["eval_loss"] == pytest.approx(want["eval_loss"], rel=rel + shape.forward_bound(), abs=0)
        assert sorted(got["weights"]) == sorted(want["weights"])
        for key, value in want["weights"].items():
            torch.testing.assert_close(got["weights"][key], value, rtol=0, atol=bound, msg=key)
    # peft starts lora_B at zero: its trained values are the whole change (measured 1.2e-2, 60x the bound; the
    # differences seen are ~4e-9). A gradient that lost one rank's half of the tokens would move it by about
    # half as much, 30x the bound.
    moved = max(v.abs().max().item() for k, v in want["weights"].items() if "lora_B" in k)
    assert moved > 20 * bound


# ------------------------------------------------------------------ no launch
def test_the_split_keeps_every_token_and_the_targets_across_the_parts() -> None:
    """Rank r's part of an odd-length row, padded to a multiple of cp; the part's last target is the next part's
    first token (labels shifted over the whole row before the split)."""
    from twinkle_hf.distributed.sequence_parallel import SequenceParallel

    ids = torch.arange(10, 17)[None].repeat(2, 1)  # 2 rows x 7 tokens
    labels = ids.clone()
    labels[:, :2] = -100
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    parts = []
    for rank in (0, 1):
        sp = object.__new__(SequenceParallel)
        sp.size, sp.rank, sp._masks = 2, rank, {}
        parts.append(sp.split({"input_ids": ids, "labels": labels, "attention_mask": mask}, None, "causal_lm"))
    whole = {k: torch.cat([p[k] for p in parts], dim=1) for k in parts[0]}
    assert torch.equal(whole["input_ids"], torch.cat([ids, torch.zeros(2, 1, dtype=ids.dtype)], dim=1))
    assert torch.equal(whole["attention_mask"], torch.cat([mask, torch.zeros(2, 1, dtype=mask.dtype)], dim=1))
    assert torch.equal(whole["position_ids"], torch.arange(8).expand(2, 8))
    assert torch.equal(whole["shift_labels"][:, :6], labels[:, 1:]) and (whole["shift_labels"][:, 6:] == -100).all()
    assert parts[0]["shift_labels"][0, -1] == ids[0, 4] == parts[1]["input_ids"][0, 0]
    assert "labels" not in whole and sp.layout.length == 8


def _model(config) -> SimpleNamespace:
    return SimpleNamespace(config=config)


def test_refusals_name_the_family_the_dimension_and_the_fix() -> None:
    import transformers
    from hf_testing import tiny_config

    from twinkle.loss import GRPOLoss
    from twinkle_hf.distributed.sequence_parallel import check_loss, check_model

    qwen35 = transformers.Qwen3_5TextConfig(num_hidden_layers=4, hidden_size=64, num_attention_heads=4,
                                            num_key_value_heads=2, head_dim=16)
    with pytest.raises(ValueError, match=r"cp_size=2 .*qwen3_5_text model has linear_attention layers \(Gated "
                                         r"DeltaNet.*Use fsdp_size for this family"):
        check_model(_model(qwen35), 2)
    with pytest.raises(ValueError, match=r"mistral model has sliding_attention layers.*fsdp_size"):
        check_model(_model(tiny_config("mistral", sliding_window=8)), 2)
    with pytest.raises(ValueError, match=r"vision-language family qwen2_vl.*fsdp_size"):
        check_model(_model(transformers.Qwen2VLConfig()), 2)
    with pytest.raises(ValueError, match=r"cp_size does not divide qwen2's num_attention_heads=4.*dividing 4"):
        check_model(_model(tiny_config("qwen2")), 3)
    flash = tiny_config("qwen2")
    flash._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match=r"qwen2 model was loaded with 'flash_attention_2'.*'sdpa'"):
        check_model(_model(flash), 2)
    assert check_model(_model(tiny_config("qwen2", sliding_window=None)), 2) in ("sdpa", "eager")
    with pytest.raises(ValueError, match=r"cp_size=2 .*GRPOLoss needs whole rows.*CrossEntropyLoss"):
        check_loss(GRPOLoss(), "causal_lm", 2)
    with pytest.raises(ValueError, match=r"task='embedding' needs whole rows"):
        check_loss(None, "embedding", 2)


def test_cp_ranks_join_the_data_ranks_of_the_wrapping_plan() -> None:
    from twinkle import DeviceMesh
    from twinkle_hf.distributed.plan import make_plan
    from twinkle_hf.distributed.sequence_parallel import wrap_mesh

    mesh = DeviceMesh.from_sizes(cp_size=2, world_size=2)
    assert make_plan("native_fsdp", wrap_mesh(mesh), world_size=2).kind == "ddp"
    hsdp = DeviceMesh.from_sizes(dp_size=2, fsdp_size=2, cp_size=2, world_size=8)
    folded = wrap_mesh(hsdp)
    assert (folded.dp_size, folded.fsdp_size, folded.cp_size) == (2, 4, 1)
    for rank in range(8):  # a rank's data replica is its dp coordinate on both meshes
        assert hsdp.coords(rank)["dp"] == folded.coords(rank)["dp"]
    with pytest.raises(ValueError, match=r"cp_size=2.*\{'tp': 2\}.*set cp_size=1"):
        wrap_mesh(DeviceMesh.from_sizes(cp_size=2, tp_size=2, world_size=4))


@pytest.mark.parametrize("kind", ["cross_entropy", "chunked", "fused"])
def test_the_parts_losses_add_up_to_the_whole_rows(kind: str) -> None:
    """Each part's loss over its ``shift_labels`` (the split of ``split``), summed over the parts with their
    target counts, is the loss of the whole rows over their labels; token accuracy counts the same tokens.

    Bound: the parts' two sums and the whole rows' one sum add the same token losses in another order, each a
    log-sum-exp over the vocabulary (tests/rounding.py, ``chain_bound``); the counts are exact.
    """
    from rounding import chain_bound

    from twinkle.loss import ChunkedCrossEntropyLoss, CrossEntropyLoss
    from twinkle.metric.builtin import TokenAccuracy
    from twinkle_hf.distributed.sequence_parallel import SequenceParallel
    from twinkle_hf.kernels.fused_ce_loss import LigerFusedLinearCrossEntropyLoss, fused_ce_outputs

    gen = torch.Generator().manual_seed(3)
    rows, length, hidden_size, vocab = 2, 9, 8, 32
    ids = torch.randint(0, vocab, (rows, length), generator=gen)
    labels = ids.clone()
    labels[:, :3] = -100
    hidden = torch.randn(rows, length, hidden_size, generator=gen)
    head = torch.nn.Linear(hidden_size, vocab, bias=False)
    loss = {"cross_entropy": CrossEntropyLoss(reduction="sum"), "chunked": ChunkedCrossEntropyLoss(chunk_size=4),
            "fused": LigerFusedLinearCrossEntropyLoss(reduction="sum")}[kind]

    def outputs(states: torch.Tensor) -> dict:
        return fused_ce_outputs(states, head) if kind == "fused" else {"logits": head(states)}

    whole = {"input_ids": ids, "labels": labels}
    want, want_items = loss.compute(whole, outputs(hidden))
    total, items, accuracy, want_accuracy = 0.0, 0, TokenAccuracy(), TokenAccuracy()
    padded = torch.nn.functional.pad(hidden, (0, 0, 0, 1))  # the split pads the 9 tokens to 10
    for rank in (0, 1):
        sp = object.__new__(SequenceParallel)
        sp.size, sp.rank, sp._masks = 2, rank, {}
        part = sp.split(whole, loss, "fused_lm_ce" if kind == "fused" else "causal_lm")
        value, count = loss.compute(part, outputs(padded[:, rank * 5:(rank + 1) * 5]))
        total, items = total + value, items + count
        if kind != "fused":
            accuracy.update(part, outputs(padded[:, rank * 5:(rank + 1) * 5]))
    assert int(items) == int(want_items) == int((labels[:, 1:] != -100).sum())
    assert float(total.detach()) == pytest.approx(float(want.detach()), rel=chain_bound(vocab, rows * length), abs=0)
    if kind != "fused":
        want_accuracy.update(whole, outputs(hidden))
        assert (accuracy.total_correct, accuracy.total_count) == (want_accuracy.total_correct,
                                                                  want_accuracy.total_count)
