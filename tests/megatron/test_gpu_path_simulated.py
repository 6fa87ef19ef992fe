"""The CUDA code path (Megatron DDP, DistributedOptimizer, the forward-backward schedule, dist-checkpoint resume,
several multi-LoRA tenants, bf16 LoRA) run on CPU in a subprocess that redirects megatron's hard-coded
``device='cuda'`` allocations.

A simulation of the wiring, not a GPU run (see scripts/simulated_cuda.py); the references are the
CPU stand-in path in this process and the run's own uninterrupted trajectory.
"""

from __future__ import annotations

import json

import pytest
from megatron_testing import make_batch, megatron_model
from rounding import U, tiny_hf

#: the same float32 sums in another order (megatron's schedule, micro-batches, another process): a forward's and
#: a step's bound for 4 rows of 12 tokens (tests/rounding.py); step k carries the earlier steps' rounding twice
FWD, STEP = tiny_hf(12, 4, vocab=125).forward_bound(), tiny_hf(12, 4, vocab=125).step_bound()

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)


@pytest.fixture(scope="module")
def run(launches):
    launch, out = launches["simulated"]
    code, stdout, stderr = launch.wait()
    assert code == 0, stdout[-2000:] + stderr[-4000:]
    return launches["qwen2"], json.loads((out / "report.json").read_text())


def test_the_gpu_path_uses_megatron_ddp_and_the_distributed_optimizer(run):
    _, report = run
    assert report["optimizer_kind"] == "megatron-core DistributedOptimizer"
    assert report["model_wrapped"] == "DistributedDataParallel"


def test_microbatches_through_the_schedule_give_the_token_weighted_loss_and_gradient(run):
    path, report = run
    stand_in = megatron_model(path)  # CPU eager path: one forward over the whole batch
    stand_in.set_optimizer("default", lr=5e-3)
    reference = stand_in.forward_backward(inputs=make_batch(seed=7))
    reference_norm = stand_in.clip_grad_norm(1.0)
    assert report["losses_by_microbatches"] == pytest.approx([reference] * 3, rel=FWD)
    assert report["norms_by_microbatches"] == pytest.approx([reference_norm] * 3, rel=STEP)


def test_distributed_optimizer_trains_like_the_reference_adamw(run):
    path, report = run
    stand_in = megatron_model(path)
    stand_in.set_optimizer("default", lr=5e-3, weight_decay=0.01, adam_eps=1.0)  # as scripts/simulated_cuda.py
    stand_in.set_lr_scheduler("default", lr_warmup_steps=1, lr_decay_steps=6, lr_decay_style="linear")
    losses = []
    for step in range(4):
        losses.append(stand_in.forward_backward(inputs=make_batch(seed=100 + step)))
        stand_in.clip_grad_and_step(1.0)
    assert report["straight"] == pytest.approx(losses, rel=(2 * 3 + 1) * STEP)


def test_dist_checkpoint_resume_continues_the_same_losses(run):
    _, report = run
    assert {"optimizer_dist", "scheduler.pt", "rng_state.pt", "model.safetensors"} <= set(report["checkpoint_files"])
    assert report["progress"]["cur_step"] == 2
    assert report["resumed"] == report["straight"]  # bitwise


def test_lora_trains_through_the_schedule(run):
    _, report = run
    losses = report["lora_losses"]
    assert losses[-1] < losses[0] - 0.05, losses


def test_several_tenants_each_train_with_their_own_distributed_optimizer(run):
    _, report = run
    book = report["tenants_bookkeeping"]
    assert book["kinds"] == ["megatron-core DistributedOptimizer"] * 2
    assert book["own_chunks"] and book["chunk_params_are_the_slot"]  # own gradient buffers, own optimizer state
    assert report["tenants_interleaved"] == report["tenants_alone"]  # bitwise: nothing leaks between tenants
    assert all(report["tenants_untouched"])  # a tenant's step leaves the other's slot bit-identical


def test_a_released_slot_serves_the_next_tenant_like_a_fresh_one(run):
    _, report = run
    book = report["tenants_bookkeeping"]
    assert book["reacquired_slot"] and book["reused_chunk"]  # same slot, same DDP chunk, new optimizer
    assert report["tenants_reacquired"] == report["tenants_alone"]["t1"]


def test_forward_backward_multi_on_the_gpu_path_equals_each_tenants_schedule(run):
    """Stacked rows of two tenants through the shared module (each slot's DDP chunk collects its own gradients)
    against each tenant's forward_backward through megatron's schedule. float32: wider matmuls reorder sums."""
    _, report = run
    batched = report["batched"]
    for fused, sequential in zip(batched["losses"]["fused"], batched["losses"]["sequential"], strict=True):
        assert fused == pytest.approx(sequential, rel=3 * FWD)  # the second step's weights differ too
    for fused, sequential in zip(batched["norms"]["fused"], batched["norms"]["sequential"], strict=True):
        assert fused == pytest.approx(sequential, rel=3 * STEP)
    # two Adam steps with eps = 1 at lr 2e-2 (scripts/simulated_cuda.py): an update's slope in g is at most 2 lr,
    # g within 3 steps' bound of the largest gradient (at most the clipped norm 1, rounding.within's sqrt(128));
    # u per stored step
    assert batched["state_max_diff"] < 2 * 2 * 2e-2 * 3 * STEP * (1 + 128**0.5) + 2 * U
    assert batched["steps"] == [2, 2]


def test_bf16_lora_keeps_frozen_weights_bf16_and_fp32_master_copies(run):
    _, report = run
    bf16 = report["bf16"]
    assert bf16["frozen_dtypes"] == ["torch.bfloat16"] and bf16["lora_model_dtypes"] == ["torch.bfloat16"]
    assert bf16["master_dtypes"] == ["torch.float32"] and bf16["master_numel"] == bf16["lora_numel"]
    assert bf16["grad_buffer_params_are_lora"]  # no gradient buffer (nor master copy) for a frozen weight
    assert bf16["losses"][-1] < bf16["losses"][0] - 0.2, bf16["losses"]


def test_lm_head_lora_trains_and_resumes_through_the_gpu_path(run):
    """The output layer's LoRA in the slot's DDP chunk and distributed optimizer; its dist-checkpoint resume (the
    wrapped output layer keeps megatron's sharded-state names) continues bit for bit."""
    _, report = run
    head = report["lm_head"]
    assert head["kind"] == "megatron-core DistributedOptimizer" and head["output_lora_in_chunk"]
    assert {"optimizer_dist", "adapter_model.safetensors"} <= set(head["files"])
    assert head["resumed"] == head["straight"]  # bitwise
    assert head["output_b_max"] > 1e-3  # B starts at zero: the output layer's LoRA trained
