"""torchrun job (2 CPU ranks): tenants acquired, trained and released on a DDP- or FSDP2-wrapped
multi-LoRA model; a tenant saved (at once, in the background) in one slot and resumed in another;
memory_efficient_init against a plain build.

Usage: torchrun --nproc_per_node=2 dist_job.py OUT_DIR JOB [JOB ...] (ddp, fsdp2, ckpt_ddp, ckpt_fsdp2,
meminit_ddp, meminit_fsdp2); ``run()`` in one process is the reference of ddp/fsdp2. Writes
OUT_DIR/<job>.rank<r>.pt or OUT_DIR/<job>.rank<r>.error.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hf"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hf_testing import make_batch, reset_peak_rss, status_mb, tensor_hash, tiny_config  # noqa: E402


def rank_world() -> tuple[int, int]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def rows(batch: dict, rank: int, world: int) -> dict:
    return {k: v[rank::world] for k, v in batch.items()}


def run(mode: str = "ddp") -> dict:
    from peft import LoraConfig

    from twinkle import DeviceMesh
    from twinkle.model import MultiLoraTransformersModel

    rank, world = rank_world()
    torch.manual_seed(0)
    fsdp = world if mode == "fsdp2" else 1
    model = MultiLoraTransformersModel(config=tiny_config(), mixed_precision="no", max_loras=2, max_r=8,
                                       strategy="native_fsdp",
                                       device_mesh=DeviceMesh.from_sizes(fsdp_size=fsdp, world_size=world))
    losses: dict[str, list[float]] = {"a": [], "b": [], "multi": []}
    model.multi_lora.acquire_lora("a", LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    # 'b' targets one layer only: most parameters of the model are unused (frozen base, other slot) for it
    model.multi_lora.acquire_lora("b", LoraConfig(r=2, lora_alpha=4, target_modules=["model.layers.1.mlp.up_proj"]))
    initial = {"b": model.get_state_dict(adapter_name="b")}
    for tenant in ("a", "b"):
        model.set_optimizer("SGD", lr=0.5, adapter_name=tenant)
    for step in range(3):
        for tenant in ("a", "b"):
            batch = rows(make_batch(10 * step + len(losses[tenant]), rows=4), rank, world)
            losses[tenant].append(model.forward_backward(inputs=batch, adapter_name=tenant))
            model.clip_grad_and_step(adapter_name=tenant)
    multi = model.forward_backward_multi({t: rows(make_batch(50 + i, rows=4), rank, world)
                                          for i, t in enumerate(("a", "b"))})
    losses["multi"] = [multi["a"], multi["b"]]
    for tenant in ("a", "b"):
        model.clip_grad_and_step(adapter_name=tenant)
    state_b = model.get_state_dict(adapter_name="b")
    model.multi_lora.release_lora("a")
    model.multi_lora.acquire_lora("c", LoraConfig(r=8, lora_alpha=8, target_modules="all-linear"))
    initial["c"] = model.get_state_dict(adapter_name="c")
    model.set_optimizer("SGD", lr=0.5, adapter_name="c")
    losses["c"] = [model.forward_backward(inputs=rows(make_batch(77, rows=4), rank, world), adapter_name="c")]
    model.clip_grad_and_step(adapter_name="c")
    return {"losses": losses, "b": state_b, "c": model.get_state_dict(adapter_name="c"),
            "initial": initial, "names": model.multi_lora.names(), "kind": model.backend.dist_plan.kind}


def _model(mode: str, **kwargs: Any) -> Any:
    from twinkle import DeviceMesh
    from twinkle.model import MultiLoraTransformersModel

    _, world = rank_world()
    torch.manual_seed(0)
    if "model_id" not in kwargs:
        kwargs.setdefault("config", tiny_config())
    return MultiLoraTransformersModel(mixed_precision="no", max_loras=2, max_r=8, strategy="native_fsdp",
                                      device_mesh=DeviceMesh.from_sizes(fsdp_size=world if mode == "fsdp2" else 1,
                                                                        world_size=world), **kwargs)


def _start(model: Any, tenant: str, seed: int) -> str:
    from peft import LoraConfig

    name = model.acquire_lora(tenant, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]), seed=seed)
    _optimizer(model, tenant)
    return name


def _optimizer(model: Any, tenant: str) -> None:
    model.set_optimizer("AdamW", lr=0.02, adapter_name=tenant)
    model.set_lr_scheduler("LinearLR", start_factor=0.5, total_iters=6, adapter_name=tenant)


def _train(model: Any, tenant: str, first: int, steps: int = 3) -> list[float]:
    rank, world = rank_world()
    losses = []
    for i in range(first, first + steps):
        losses.append(float(model.forward_backward(inputs=rows(make_batch(100 + i, rows=4), rank, world),
                                                   adapter_name=tenant)))
        model.clip_grad_and_step(adapter_name=tenant)
    return losses


def _tenant_hash(model: Any, tenant: str) -> str:
    """The tenant's whole weights, optimizer moments (gathered), scheduler and progress; every rank calls it."""
    from twinkle_hf.multi_lora.checkpoint import host_copy

    group = model._group(tenant)
    return tensor_hash({"weights": model.get_state_dict(adapter_name=tenant),
                        "optimizer": host_copy(group.optimizer.state_dict()),
                        "scheduler": group.lr_scheduler.state_dict(), "step": group.cur_step})


def checkpoint(mode: str, out: Path) -> dict:
    """Tenant 'a' saved in slot 0 (at once / in the background), released, another tenant takes slot 0, 'a' is
    loaded into slot 1 and resumed: its losses and state equal an uninterrupted run's bitwise."""
    reference = _model(mode)
    _start(reference, "a", seed=7)
    result: dict[str, Any] = {"want_losses": _train(reference, "a", 0) + _train(reference, "a", 3),
                              "want": _tenant_hash(reference, "a")}
    del reference
    for async_save in (False, True):
        model = _model(mode)
        slots = [_start(model, "a", seed=7)]
        losses = _train(model, "a", 0)
        pending = model.save(f"a_async{async_save}", str(out / f"ckpt_{mode}"), adapter_name="a", save_optimizer=True,
                             async_save=async_save)
        if async_save:
            _train(model, "a", 50, steps=1)  # training goes on; the checkpoint holds the state at the call
        model.release_lora("a")
        slots.append(_start(model, "other", seed=3))
        _train(model, "other", 60, steps=1)
        path = pending.wait() if async_save else pending
        files = sorted(os.listdir(path))
        slots.append(model.load_lora("a", path))
        _optimizer(model, "a")
        model.resume_from_checkpoint(path, adapter_name="a")
        losses += _train(model, "a", 3)
        result["async" if async_save else "sync"] = {"slots": slots, "losses": losses, "files": files,
                                                     "state": _tenant_hash(model, "a")}
    return result


def _slot_state(model: Any) -> dict[str, torch.Tensor]:
    from twinkle.collective import full_tensor

    return {n: full_tensor(p.detach()).clone() for n, p in model.model.named_parameters() if "lora_" in n}


#: large enough that host memory shows the weights (~55 MiB in float32) above the noise of a process
MEDIUM = {"hidden_size": 384, "intermediate_size": 1024, "num_hidden_layers": 6, "vocab_size": 4096}


def memory_efficient(mode: str, out: Path) -> dict:
    """The same multi-LoRA model with and without memory_efficient_init: weights, slot snapshots and a tenant's
    step and release bitwise; rank 1's peak host RSS while constructing is lower (under FSDP2 also through
    wrapping; a DDP rank allocates its full replica when wrapped, whatever the flag).

    The base is a random init from the config: in a plain build every rank draws it from the generator, with
    memory_efficient_init rank 0 alone does, and the slots' peft init (drawn next) must still be rank 0's."""
    from twinkle.collective import full_tensor

    def build(efficient: bool) -> Any:
        return _model(mode, memory_efficient_init=efficient, target_modules=["q_proj", "v_proj"],
                      config=tiny_config("qwen2", **MEDIUM))

    def measured(efficient: bool) -> dict[str, Any]:
        base = reset_peak_rss()
        model = build(efficient)
        built_peak = status_mb("VmHWM") - base
        snapshots = {f"{slot}.{layer}": pair for slot, layers in model.slots.initial.items()
                     for layer, pair in layers.items()}
        generator = torch.get_rng_state()
        model.parallelize()
        wrapped_peak = status_mb("VmHWM") - base
        weights = {n: full_tensor(p.detach()).clone() for n, p in model.model.named_parameters()}
        buffers = {n: b.clone() for n, b in model.model.named_buffers()}
        _start(model, "t", seed=5)
        losses = _train(model, "t", 0, steps=2)
        model.release_lora("t")
        released = _slot_state(model)
        del model
        return {"built_peak": built_peak, "wrapped_peak": wrapped_peak, "snapshots": snapshots, "generator": generator,
                "weights": weights, "buffers": buffers, "losses": losses, "released": released}

    build(False)  # warm-up: one-time allocations are not charged to either run
    efficient = measured(True)
    plain = measured(False)
    same = {key: tensor_hash(efficient[key]) == tensor_hash(plain[key])
            for key in ("snapshots", "generator", "weights", "buffers", "released")}
    return {"same": same, "losses": (efficient["losses"], plain["losses"]),
            "snapshots": tensor_hash(efficient["snapshots"]),
            "peak_rss_mb": {f"{kind}_{when}": run[f"{when}_peak"] for kind, run in (("efficient", efficient),
                                                                                   ("plain", plain))
                            for when in ("built", "wrapped")}}


def main() -> None:
    import twinkle

    out, jobs = Path(sys.argv[1]), sys.argv[2:]
    twinkle.initialize(seed=0, timeout_s=120)
    rank, _ = rank_world()
    for job in jobs:
        kind, _, mode = job.rpartition("_")
        try:
            result = {"": run, "ckpt": checkpoint, "meminit": memory_efficient}[kind](*((mode,) if not kind else
                                                                                      (mode, out)))
        except Exception:
            (out / f"{job}.rank{rank}.error").write_text(traceback.format_exc())
            raise
        torch.save(result, out / f"{job}.rank{rank}.pt")


if __name__ == "__main__":
    main()
