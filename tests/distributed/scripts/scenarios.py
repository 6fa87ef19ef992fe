"""Training scenarios run both under torchrun (2 ranks) and in one process (the reference).

Every scenario builds a tiny seeded model, trains on the same global batches (each rank takes rows
``rank::world``, the DataLoader's slice) and returns the per-step losses, the metrics and the
final trainable parameters as full tensors.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hf"))
from hf_testing import make_batch, tiny_config  # noqa: E402

STEPS = 5
ROWS = 4


def rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def local_rows(batch: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    """This data rank's rows ``rank::world`` (what DataLoader yields under torchrun)."""
    return {k: v[rank::world] for k, v in batch.items()}


def global_batches(steps: int = STEPS, seed: int = 100, rows: int = ROWS) -> list[dict[str, torch.Tensor]]:
    return [make_batch(seed + i, rows=rows, length=12) for i in range(steps)]


def lora_config(r: int = 4) -> Any:
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


def build(strategy: str = "native_fsdp", fsdp: int = 1, dp: int | None = None, lora: bool = False,
          optimizer: str = "AdamW", adapters: tuple[str, ...] = ("a",), memory_efficient_init: bool = False,
          model_id: str | None = None, config: Any = None, **kwargs: Any) -> Any:
    from twinkle import DeviceMesh
    from twinkle.model import TransformersModel

    _, world = rank_world()
    mesh = DeviceMesh.from_sizes(fsdp_size=fsdp if world > 1 else 1, dp_size=dp if world > 1 else None,
                                 world_size=world)
    torch.manual_seed(0)
    source = {"model_id": model_id} if model_id else {"config": config or tiny_config("qwen2")}
    kwargs.setdefault("mixed_precision", "no")
    model = TransformersModel(**source, strategy=strategy, device_mesh=mesh,
                              memory_efficient_init=memory_efficient_init, **kwargs)
    if lora:
        for name in adapters:
            torch.manual_seed(1)
            model.add_adapter_to_model(name, lora_config())
    for name in (adapters if lora else (None,)):
        # AdamW with eps=1: Lipschitz in the gradient, so the ranks' float32 rounding stays bounded (dist_bounds.py)
        extra = {"adjust_lr_fn": "match_rms_adamw"} if optimizer == "Muon" else {"eps": 1.0}
        model.set_optimizer(optimizer, lr=1e-2, adapter_name=name, **extra)
    return model


def trainable_state(model: Any, adapter: str | None = None) -> dict[str, torch.Tensor]:
    """Full (gathered) trainable parameters by name; a collective under FSDP2."""
    from twinkle.collective import full_tensor

    group = model._group(adapter)
    names = {id(p): n for n, p in model.model.named_parameters()}
    return {names[id(p)]: full_tensor(p.detach()).clone() for p in model.backend.parameters(group)}


def train(model: Any, batches: list[dict[str, torch.Tensor]], adapter: str | None = None, task: str = "causal_lm",
          accumulation: int = 1) -> dict[str, Any]:
    rank, world = rank_world()
    losses, metrics = [], []
    initial = trainable_state(model, adapter)
    for batch in batches:
        mine = local_rows(batch, rank, world)
        if accumulation == 1:
            losses.append(model.forward_backward(inputs=mine, adapter_name=adapter, task=task))
        else:  # micro-batch i holds global rows [i*n, (i+1)*n): the same rows in every layout
            chunk = batch["input_ids"].shape[0] // accumulation
            micro = [model.forward_backward(inputs=local_rows({k: v[i * chunk:(i + 1) * chunk]
                                                               for k, v in batch.items()}, rank, world),
                                            adapter_name=adapter, task=task,
                                            gradient_accumulation_steps=accumulation)
                     for i in range(accumulation)]
            losses.append(micro)
        model.clip_grad_and_step(adapter_name=adapter)
        metrics.append(model.calculate_metric(is_training=True, adapter_name=adapter))
    for m in metrics:
        m.pop("tokens_per_second", None)
    first = next(iter(model.model.parameters()))
    layout = (tuple(first.device_mesh.shape), [str(p) for p in first.placements]) \
        if hasattr(first, "device_mesh") else None
    return {"losses": losses, "metrics": metrics, "params": trainable_state(model, adapter), "initial": initial,
            "layout": layout,
            "wrapped": model.backend.dist_plan.kind}


def logits(model: Any, batch: dict[str, torch.Tensor], adapter: str | None = None) -> torch.Tensor:
    """Full-batch logits (every rank runs the same rows)."""
    out = model.forward_only(inputs=batch, adapter_name=adapter)
    return out["logits"].detach().clone()


# ----------------------------------------------------------------------------- scenarios
def sc_full(strategy: str, fsdp: int, **kw: Any) -> dict[str, Any]:
    return train(build(strategy, fsdp=fsdp, **kw), global_batches())


def sc_lora(strategy: str, fsdp: int, **kw: Any) -> dict[str, Any]:
    return train(build(strategy, fsdp=fsdp, lora=True, **kw), global_batches(), adapter="a")


SCENARIOS: dict[str, Any] = {
    "ddp_full": lambda: sc_full("native_fsdp", 1),
    "ddp_lora": lambda: sc_lora("accelerate", 1),
    "fsdp_full": lambda: sc_full("native_fsdp", 2),
    "fsdp_lora": lambda: sc_lora("native_fsdp", 2),
    "accel_full": lambda: sc_full("accelerate", 2),
    "accel_lora": lambda: sc_lora("accelerate", 2),
    "fsdp_lora_muon": lambda: sc_lora("native_fsdp", 2, optimizer="Muon"),
    "fsdp_full_muon": lambda: sc_full("native_fsdp", 2, optimizer="Muon"),
    "ddp_accum": lambda: train(build("native_fsdp", fsdp=1), global_batches(3), accumulation=2),
    "fsdp_accum": lambda: train(build("native_fsdp", fsdp=2), global_batches(3), accumulation=2),
}


def sc_two_adapters(strategy: str, fsdp: int) -> dict[str, Any]:
    """Two adapters, each with its own optimizer, trained alternately on different batches."""
    model = build(strategy, fsdp=fsdp, lora=True, adapters=("a", "b"))
    batches = global_batches(4)
    first = train(model, batches[:2], adapter="a")
    second = train(model, batches[2:], adapter="b")
    return {"losses": first["losses"] + second["losses"], "params": {**first["params"], **second["params"]},
            "metrics": first["metrics"] + second["metrics"], "initial": {**first["initial"], **second["initial"]}}


SCENARIOS["ddp_two_adapters"] = lambda: sc_two_adapters("native_fsdp", 1)
SCENARIOS["fsdp_two_adapters"] = lambda: sc_two_adapters("native_fsdp", 2)


def sc_fused(fsdp: int = 2, strategy: str = "native_fsdp") -> dict[str, Any]:
    """Seed 003's fused-CE setup (LoRA + Muon + LigerFusedLinearCrossEntropyLoss) with unequal start times.

    No barrier in the script: the framework runs the fused forward through the root FSDP unit.
    """
    import time

    model = build(strategy, fsdp=fsdp, lora=True, optimizer="Muon")
    model.set_loss("LigerFusedLinearCrossEntropyLoss", adapter_name="a", reduction="sum")
    rank, _ = rank_world()
    time.sleep(0.5 * rank)  # ranks enter the loop desynchronised, as in the upstream report
    return train(model, global_batches(3), adapter="a", task="fused_lm_ce")


SCENARIOS["fsdp_fused"] = sc_fused
SCENARIOS["accel_fused"] = lambda: sc_fused(strategy="accelerate")


def reference(name: str) -> dict[str, Any]:
    """The scenario in this single process (WORLD_SIZE unset)."""
    assert os.environ.get("WORLD_SIZE", "1") == "1"
    return SCENARIOS[name]()


# ----------------------------------------------------------------------------- checkpoints
def probe_batch() -> dict[str, torch.Tensor]:
    return make_batch(999, rows=2, length=10)


def sc_resume(strategy: str, fsdp: int, lora: bool) -> dict[str, Any]:
    """Train 3 steps, save (DCP + HF export), train 2 more; a fresh model resumed from the save trains the
    same 2 steps. Also the export's reference logits at the save point."""
    from torch.optim.lr_scheduler import StepLR

    out = Path(os.environ["DIST_TEST_OUT"])
    name = f"ckpt_{strategy}_{fsdp}_{'lora' if lora else 'full'}"
    adapter = "a" if lora else None
    batches = global_batches(5)

    def fresh() -> Any:
        model = build(strategy, fsdp=fsdp, lora=lora)
        model.set_lr_scheduler(StepLR, step_size=1, gamma=0.8, adapter_name=adapter)
        return model

    model = fresh()
    train(model, batches[:3], adapter=adapter)
    path = model.save(name, output_dir=str(out), adapter_name=adapter, save_optimizer=True,
                      consumed_train_samples=3 * ROWS)
    at_save = logits(model, probe_batch(), adapter)
    continued = train(model, batches[3:], adapter=adapter)
    resumed_model = fresh()
    progress = resumed_model.resume_from_checkpoint(path, adapter_name=adapter)
    resumed = train(resumed_model, batches[3:], adapter=adapter)
    exported = fresh()
    exported.load(path, adapter_name=adapter)  # the HF export into a sharded model (weights only)
    return {"logits_loaded_export": logits(exported, probe_batch(), adapter), "path": path,
            "logits_at_save": at_save, "continued": continued["losses"],
            "resumed": resumed["losses"], "progress": progress,
            "continued_params": continued["params"], "resumed_params": resumed["params"]}


SCENARIOS["resume_fsdp_lora"] = lambda: sc_resume("native_fsdp", 2, lora=True)
SCENARIOS["resume_fsdp_full"] = lambda: sc_resume("native_fsdp", 2, lora=False)
SCENARIOS["resume_ddp_lora"] = lambda: sc_resume("accelerate", 1, lora=True)


def sc_nosync_probe(fsdp: int) -> dict[str, Any]:
    """Gradients after the first of two micro-batches: local under DDP (rank-dependent), unreduced under FSDP2
    with the no-sync opt-in (``fsdp_config={'sync_each_microbatch': False}``)."""
    from twinkle.collective import full_tensor

    rank, world = rank_world()
    model = build("native_fsdp", fsdp=fsdp, fsdp_config={"sync_each_microbatch": False} if fsdp > 1 else None)
    batch = global_batches(1)[0]
    half = {k: v[:2] for k, v in batch.items()}
    model.forward_backward(inputs=local_rows(half, rank, world), gradient_accumulation_steps=2)
    name, param = next((n, p) for n, p in model.model.named_parameters() if n.endswith("q_proj.weight"))
    between = None if param.grad is None else param.grad.detach().clone()
    if fsdp > 1:
        between = None if param.grad is None else full_tensor(param.grad).clone()
    rest = {k: v[2:] for k, v in batch.items()}
    model.forward_backward(inputs=local_rows(rest, rank, world), gradient_accumulation_steps=2)
    after = full_tensor(param.grad.detach()).clone()
    return {"between": between, "after": after}


SCENARIOS["ddp_nosync"] = lambda: sc_nosync_probe(1)
SCENARIOS["fsdp_nosync"] = lambda: sc_nosync_probe(2)


def sc_fused_adamw() -> dict[str, Any]:
    """The fused-CE path under FSDP2 with AdamW (fp32 all through: a tight comparison)."""
    model = build("native_fsdp", fsdp=2, lora=True)
    model.set_loss("LigerFusedLinearCrossEntropyLoss", adapter_name="a", reduction="sum")
    return train(model, global_batches(3), adapter="a", task="fused_lm_ce")


SCENARIOS["fsdp_fused_adamw"] = sc_fused_adamw

#: Run with 4 processes: dp=2 x fsdp=2 (HSDP: replicate x shard).
HSDP = {"hsdp_full": lambda: sc_full("native_fsdp", 2), "hsdp_lora": lambda: sc_lora("native_fsdp", 2)}
SCENARIOS.update(HSDP)


# ----------------------------------------------------------------------------- fp16 skipped steps (issue 12 §2)
def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def sc_fp16_skip(strategy: str = "native_fsdp", fsdp: int = 2) -> dict[str, Any]:
    """fp16 under FSDP2: after a normal step, rank 1 alone gets an inf in one of its gradient shards.

    Every rank must skip that step (same scale, same weights), then train on identically.
    """
    from torch.optim.lr_scheduler import StepLR

    rank, world = rank_world()
    model = build(strategy, fsdp=fsdp, mixed_precision="fp16", grad_scaler_config={"init_scale": 256.0})
    model.set_lr_scheduler(StepLR, step_size=1, gamma=0.5)
    group = model.optimizer_group["default"]
    batches = global_batches(3)
    record: dict[str, Any] = {"scales": [], "steps": [], "lrs": []}

    def step(batch: dict[str, torch.Tensor], poison: bool) -> None:
        model.forward_backward(inputs=local_rows(batch, rank, world))
        if poison and rank == world - 1:  # only this rank's shard of one gradient
            grad = _local(next(p for p in model.model.parameters() if p.grad is not None).grad)
            grad.view(-1)[0] = float("inf")
        model.clip_grad_and_step(max_grad_norm=None)  # no norm: the skip is the scaler's found_inf alone
        record["scales"].append(group.scaler.get_scale())
        record["steps"].append(group.cur_step)
        record["lrs"].append(group.optimizer.param_groups[0]["lr"])

    step(batches[0], poison=False)
    record["before"] = trainable_state(model)
    record["local_before"] = {n: _local(p.detach()).clone() for n, p in model.model.named_parameters()}
    step(batches[1], poison=True)
    record["after_skip"] = trainable_state(model)
    record["local_after_skip"] = {n: _local(p.detach()).clone() for n, p in model.model.named_parameters()}
    record["skipped_steps"] = model.calculate_metric(is_training=True)["skipped_steps"]
    step(batches[2], poison=False)
    record["final"] = trainable_state(model)
    return record


SCENARIOS["fsdp_fp16_skip"] = sc_fp16_skip


# ----------------------------------------------------------------------------- accumulation memory (§4)
def gradient_bytes(model: Any) -> int:
    """Bytes of gradient this rank holds: its ``p.grad`` (a shard under FSDP2) plus any unsharded gradient
    FSDP2 keeps between boundaries when it does not reduce-scatter (``FSDPParam`` internals)."""
    from torch.distributed.fsdp import FSDPModule

    total = sum(_local(p.grad).numel() * p.grad.element_size() for p in model.model.parameters()
                if p.grad is not None)
    for module in model.model.modules():
        if not isinstance(module, FSDPModule):
            continue
        param_group = module._get_fsdp_state()._fsdp_param_group
        for fsdp_param in param_group.fsdp_params if param_group is not None else ():
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            for grad in (fsdp_param.unsharded_accumulated_grad, getattr(unsharded, "grad", None)):
                if grad is not None:
                    total += _local(grad).numel() * grad.element_size()
    return total


def sc_grad_memory(sync_each_microbatch: bool) -> dict[str, Any]:
    """Per-rank gradient bytes after the first of two micro-batches of a full-parameter FSDP2 run, and the
    run's losses (compared with one process)."""
    rank, world = rank_world()
    config = {} if sync_each_microbatch else {"fsdp_config": {"sync_each_microbatch": False}}
    model = build("native_fsdp", fsdp=2, **config)
    initial = trainable_state(model)  # before the probe step: the reference comparison covers all 4 steps
    model_bytes = sum(p.numel() * p.element_size() for p in model.model.parameters())  # full shapes
    batch = global_batches(1)[0]
    model.forward_backward(inputs=local_rows({k: v[:2] for k, v in batch.items()}, rank, world),
                           gradient_accumulation_steps=2)
    between = gradient_bytes(model)
    model.forward_backward(inputs=local_rows({k: v[2:] for k, v in batch.items()}, rank, world),
                           gradient_accumulation_steps=2)
    model.clip_grad_and_step()
    result = train(model, global_batches(3, seed=200), accumulation=2)
    return {**result, "initial": initial, "grad_bytes_between": between, "model_bytes": model_bytes}


SCENARIOS["fsdp_grad_memory"] = lambda: sc_grad_memory(True)
SCENARIOS["fsdp_grad_memory_nosync"] = lambda: sc_grad_memory(False)


# ----------------------------------------------------------------------------- sharded loading (§3)
def saved_checkpoint(tied: bool = False) -> Path:
    """A tiny Qwen2 saved with save_pretrained (odd vocabulary: uneven shards), written once per job."""
    from transformers import AutoModelForCausalLM

    from twinkle.collective import barrier

    path = Path(os.environ["DIST_TEST_OUT"]) / f"tiny_saved{'_tied' if tied else ''}"
    rank, _ = rank_world()
    if rank == 0 and not (path / "config.json").is_file():
        torch.manual_seed(7)
        config = tiny_config("qwen2", vocab_size=129, tie_word_embeddings=tied)
        AutoModelForCausalLM.from_config(config).save_pretrained(str(path))
    barrier()
    return path


def sc_load(strategy: str, lora: bool, mixed_precision: str = "no", fsdp: int = 2,
            tied: bool = False) -> dict[str, Any]:
    """Load the saved checkpoint (FSDP2: built on meta, each rank reads its shards), then train 2 steps."""
    from twinkle import DeviceMesh
    from twinkle.model import TransformersModel
    from twinkle_hf.model.meta import on_meta

    _, world = rank_world()
    mesh = DeviceMesh.from_sizes(fsdp_size=fsdp if world > 1 else 1, world_size=world)
    model = TransformersModel(model_id=str(saved_checkpoint(tied)), strategy=strategy, device_mesh=mesh,
                              mixed_precision=mixed_precision)
    built_on_meta = on_meta(model.model)
    adapter = "a" if lora else None
    if lora:
        torch.manual_seed(1)
        model.add_adapter_to_model("a", lora_config())
    model.set_optimizer("AdamW", lr=1e-2, adapter_name=adapter, eps=1.0)  # as build(): Lipschitz in the gradient
    params = {n: full_tensor_of(p) for n, p in model.model.named_parameters()}
    buffers = {n: b.detach().clone() for n, b in model.model.named_buffers()}
    dtypes = sorted({(str(p.dtype), p.requires_grad) for p in model.model.parameters()})
    hf = model.backend.hf_model()
    tied_now = hf.get_input_embeddings().weight is hf.get_output_embeddings().weight
    result = train(model, global_batches(2), adapter=adapter)
    return {"initial": params, "buffers": buffers, "dtypes": dtypes, "losses": result["losses"],
            "built_on_meta": built_on_meta, "wrapped": result["wrapped"], "tied": tied_now}


def full_tensor_of(param: torch.Tensor) -> torch.Tensor:
    from twinkle.collective import full_tensor

    return full_tensor(param.detach()).clone()


SCENARIOS["load_fsdp_full"] = lambda: sc_load("native_fsdp", lora=False)
SCENARIOS["load_accel_full"] = lambda: sc_load("accelerate", lora=False)
SCENARIOS["load_fsdp_lora_bf16"] = lambda: sc_load("native_fsdp", lora=True, mixed_precision="bf16")
SCENARIOS["load_accel_lora_bf16"] = lambda: sc_load("accelerate", lora=True, mixed_precision="bf16")
SCENARIOS["load_fsdp_tied"] = lambda: sc_load("native_fsdp", lora=False, tied=True)


# ----------------------------------------------------------------------------- strategy='accelerate' (§5)
def sc_accelerate_state() -> dict[str, Any]:
    """The FSDP2 mixed-precision policy accelerate applied, and accelerate's process-wide state around it."""
    from accelerate.state import AcceleratorState, GradientState, PartialState
    from torch.distributed.fsdp import FSDPModule

    def snapshot() -> dict[str, Any]:
        return {"shared": [dict(cls._shared_state) for cls in (PartialState, AcceleratorState, GradientState)],
                "env": {k: v for k, v in os.environ.items() if k.startswith(("ACCELERATE", "FSDP"))},
                "threads": torch.get_num_threads()}

    before = snapshot()
    model = build("accelerate", fsdp=2, mixed_precision="bf16")
    after = snapshot()
    policies = sorted({(str(m._get_fsdp_state()._mp_policy.param_dtype),
                        str(m._get_fsdp_state()._mp_policy.reduce_dtype))
                       for m in model.model.modules() if isinstance(m, FSDPModule)})
    return {"before": before, "after": after, "policies": policies}


SCENARIOS["accel_state"] = sc_accelerate_state

# 4 processes (dp=2 x fsdp=2): the default strategy on seed 000/001's mesh, accumulation and sharded loading
HSDP.update({
    "hsdp_default_strategy": lambda: sc_full("accelerate", 2),
    "hsdp_accum": lambda: train(build("native_fsdp", fsdp=2), global_batches(3, rows=8), accumulation=2),
    "hsdp_load_lora_bf16": lambda: sc_load("native_fsdp", lora=True, mixed_precision="bf16"),
    "hsdp_fp16_skip": sc_fp16_skip,
})
SCENARIOS.update(HSDP)
