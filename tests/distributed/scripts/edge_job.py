"""torchrun job: memory_efficient_init (weights + peak host RSS), bad input on 2 ranks, then a rank
that fails mid-step (the job must end, not hang).

Usage: torchrun --nproc_per_node=2 edge_job.py OUT_DIR
Writes OUT_DIR/edge.rank<r>.pt before the injected failure.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hf"))

from hf_testing import reset_peak_rss, status_mb  # noqa: E402
from scenarios import build, global_batches, local_rows, rank_world, tiny_config  # noqa: E402

import twinkle  # noqa: E402
from twinkle import DeviceMesh  # noqa: E402

BIG = {"hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 8, "vocab_size": 8192}


def peak_rss_during(fn: Any) -> tuple[Any, float]:
    """(fn(), peak host RSS in MiB above the RSS before it): freed memory goes back to the OS first
    (malloc_trim) and the kernel's high-water mark is reset (clear_refs 5), then VmHWM is read."""
    base = reset_peak_rss()
    result = fn()
    return result, status_mb("VmHWM") - base


def full_state(model: Any) -> dict[str, torch.Tensor]:
    from twinkle.collective import full_tensor

    return {n: full_tensor(p.detach()).clone() for n, p in model.model.named_parameters()}


def memory_efficient(out: Path, kind: str) -> dict[str, Any]:
    """Build the same model with and without memory_efficient_init; compare weights and peak RSS.

    DDP loads a saved checkpoint; FSDP2 builds a random init from the config (a saved safetensors
    checkpoint is read shard by shard under FSDP2 whatever the flag: see load_job.py).
    """
    import gc

    from transformers import AutoModelForCausalLM

    from twinkle.collective import barrier

    rank, _ = rank_world()
    base = out / "big_model"
    if rank == 0 and not base.exists():
        torch.manual_seed(3)
        AutoModelForCausalLM.from_config(tiny_config("qwen2", **BIG)).save_pretrained(str(base))
    barrier()
    fsdp = 1 if kind == "ddp" else 2
    strategy = "accelerate" if kind == "accel" else "native_fsdp"

    source = {"model_id": str(base)} if kind == "ddp" else {"config": tiny_config("qwen2", **BIG)}

    def load(efficient: bool) -> Any:
        return build(strategy, fsdp=fsdp, memory_efficient_init=efficient, **source)

    peak_rss_during(lambda: load(False))  # warm-up: one-time allocations are not charged to either run
    efficient_model, efficient_peak = peak_rss_during(lambda: load(True))
    efficient_state = full_state(efficient_model)
    buffers = {n: b.clone() for n, b in efficient_model.model.named_buffers()}
    del efficient_model
    gc.collect()
    plain_model, plain_peak = peak_rss_during(lambda: load(False))
    plain_state = full_state(plain_model)
    diff = max((efficient_state[k] - plain_state[k]).abs().max().item() for k in plain_state)
    buffer_diff = max(((b - dict(plain_model.model.named_buffers())[n]).abs().max().item() for n, b in buffers.items()),
                      default=0.0)
    return {"max_weight_diff": diff, "max_buffer_diff": buffer_diff, "same_keys": set(efficient_state) ==
            set(plain_state), "peak_rss_mb_efficient": efficient_peak, "peak_rss_mb_plain": plain_peak,
            "num_params": sum(v.numel() for v in plain_state.values())}


def bad_inputs() -> dict[str, str]:
    """Each wrong setup's error message (every one must fail before any weight is read)."""
    from twinkle.dataloader import DataLoader
    from twinkle.model import TransformersModel

    cases = {
        "mesh_size": lambda: TransformersModel(config=tiny_config(), device_mesh=DeviceMesh(dp_size=4)),
        "fsdp_not_dividing": lambda: TransformersModel(config=tiny_config(), device_mesh=DeviceMesh(fsdp_size=3)),
        "from_sizes_fsdp": lambda: DeviceMesh.from_sizes(fsdp_size=3),
        "cp_mesh": lambda: TransformersModel(config=tiny_config("mistral"), device_mesh=DeviceMesh(cp_size=2)),
        "batch_not_divisible": lambda: DataLoader(list(range(10)), batch_size=3),
        "unknown_strategy": lambda: TransformersModel(config=tiny_config(), strategy="deepspeed"),
        "adapter_after_wrap": _adapter_after_wrap,
    }
    messages = {}
    for name, fn in cases.items():
        try:
            fn()
            messages[name] = "NO ERROR"
        except Exception as exc:  # noqa: BLE001 - the message is the result
            messages[name] = f"{type(exc).__name__}: {exc}"
    return messages


def _adapter_after_wrap() -> None:
    from scenarios import lora_config

    model = build("native_fsdp", fsdp=2)
    model.add_adapter_to_model("late", lora_config())


def moved_before_sharding() -> dict[str, list[str]]:
    """Classes of the modules moved with ``.to(device)`` while a model is built, per plan. Under FSDP2 the
    whole model must stay where it was loaded until ``fully_shard`` places each rank's shards on its
    device (on a GPU every rank would otherwise hold the whole model there first); DDP moves it whole."""
    from twinkle.model import TransformersModel

    moved: list[str] = []
    original = torch.nn.Module.to

    def spy(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if torch._C._nn._parse_to(*args, **kwargs)[0] is not None:
            moved.append(type(self).__name__)
        return original(self, *args, **kwargs)

    result = {}
    torch.nn.Module.to = spy
    try:
        for kind, fsdp in (("fsdp2", 2), ("ddp", 1)):
            moved.clear()
            TransformersModel(config=tiny_config(), strategy="native_fsdp", mixed_precision="no",
                              device_mesh=DeviceMesh.from_sizes(fsdp_size=fsdp))
            result[kind] = list(moved)
    finally:
        torch.nn.Module.to = original
    return result


def fail_mid_step() -> None:
    """Step 1 on both ranks; in step 2 rank 1 raises while rank 0 waits in the gradient all-reduce."""
    rank, world = rank_world()
    model = build("native_fsdp", fsdp=1)
    for step, batch in enumerate(global_batches(2)):
        if step == 1 and rank == 1:
            raise RuntimeError("rank 1 injected failure in step 2")
        model.forward_backward(inputs=local_rows(batch, rank, world))
        model.clip_grad_and_step()


def main() -> None:
    out = Path(sys.argv[1])
    twinkle.initialize(seed=0, timeout_s=60)
    rank, _ = rank_world()
    result = {"meminit_ddp": memory_efficient(out, "ddp"), "meminit_fsdp": memory_efficient(out, "fsdp"),
              "meminit_accel": memory_efficient(out, "accel"),
              "bad_inputs": bad_inputs(), "moved_before_sharding": moved_before_sharding()}
    torch.save(result, out / f"edge.rank{rank}.pt")
    fail_mid_step()


if __name__ == "__main__":
    main()
