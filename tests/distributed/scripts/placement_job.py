"""torchrun job: every tensor twinkle hands to torch.distributed must be on the communication device.

The platform is ``fakeacc`` (tests/distributed/fake_accelerator.py): models run on the CPU, the
communication device is not the CPU, as on a CUDA rank under NCCL. A spy records, per API call,
the devices of the tensors twinkle code passes to a collective. The ``layer`` part also checks
the collective layer's results and its shared atomic directory on two ranks.

Usage: torchrun --nproc_per_node=2 placement_job.py OUT_DIR
Writes OUT_DIR/placement.rank<r>.pt; a part that raised holds ``{"error": traceback}``.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import fake_accelerator  # noqa: E402
from scenarios import build, global_batches, local_rows, lora_config  # noqa: E402

import twinkle  # noqa: E402
from twinkle import collective  # noqa: E402

SPY: fake_accelerator.CollectiveSpy


def layer_checks(out: Path) -> dict[str, Any]:
    """The collective layer on 2 ranks: values, the caller's device, agreement, the shared atomic directory."""
    from twinkle.checkpoint import CheckpointError, shared_atomic_directory

    rank = collective.rank()
    t = torch.tensor([rank + 1.0, 10.0 * (rank + 1)])
    result: dict[str, Any] = {
        "sum": collective.all_reduce(t).tolist(), "max": collective.all_reduce(t, "max").tolist(),
        "min": collective.all_reduce(t, "min").tolist(), "input_after": t.tolist(),
    }
    packed = collective.sum_values([torch.tensor(rank + 1), 2, torch.tensor([0.5]), True])
    result["sum_values"] = (packed.tolist(), packed.device.type, packed.dtype)
    result["sum_floats"] = collective.sum_floats([rank, 1.5])
    target = torch.arange(6.0).reshape(2, 3).t() * (rank + 1)  # non-contiguous
    collective.broadcast_(target, src=1)
    result["broadcast"] = target.tolist()
    result["all_gather"] = [p.tolist() for p in collective.all_gather(torch.tensor([rank, 2 * rank]))]
    result["gather_object"] = collective.gather_object({"rank": rank})
    result["broadcast_object"] = collective.broadcast_object(7 * rank, src=1)
    result["failed"] = collective.failed_ranks(rank == 0)
    try:
        collective.agree(rank == 0, "the probe")
        result["agree"] = None
    except RuntimeError as exc:
        result["agree"] = str(exc)

    def manifest(tmp: Path) -> None:
        (tmp / "manifest").write_text(",".join(sorted(p.name for p in tmp.iterdir())))

    with shared_atomic_directory(out / "shared_ok", finish=manifest) as tmp:
        (tmp / f"rank{rank}").write_text("x")
    result["shared_ok"] = (out / "shared_ok" / "manifest").read_text()  # every rank may read it at once
    try:
        with shared_atomic_directory(out / "shared_fail", finish=manifest) as tmp:
            (tmp / f"rank{rank}").write_text("x")
            if rank == 1:
                raise OSError("disk full on rank 1")
        result["shared_fail"] = None
    except (OSError, CheckpointError) as exc:
        result["shared_fail"] = f"{type(exc).__name__}: {exc}"
    result["left_over"] = sorted(p.name for p in out.iterdir() if p.name.startswith("."))
    result["failed_dir_exists"] = (out / "shared_fail").exists()
    result["records"] = SPY.reset()
    return result


def phases(model: Any, adapter: str | None, out: Path, name: str) -> dict[str, Any]:
    """forward_backward, clip_grad_and_step, calculate_metric, save and resume, each with its own records."""
    rank, world = collective.rank(), collective.world_size()
    records, values = {}, {}
    batches = global_batches(2)
    SPY.reset()
    values["losses"] = [float(model.forward_backward(inputs=local_rows(b, rank, world), adapter_name=adapter,
                                                     gradient_accumulation_steps=2)) for b in batches]
    records["forward_backward"] = SPY.reset()
    model.clip_grad_and_step(adapter_name=adapter, gradient_accumulation_steps=2)
    records["clip_grad_and_step"] = SPY.reset()
    values["metrics"] = model.calculate_metric(is_training=True, adapter_name=adapter)
    records["calculate_metric"] = SPY.reset()
    path = model.save(name, output_dir=str(out), adapter_name=adapter, save_optimizer=True,
                      consumed_train_samples=8)
    records["save"] = SPY.reset()
    values["progress"] = model.resume_from_checkpoint(path, adapter_name=adapter)
    records["resume_from_checkpoint"] = SPY.reset()
    values["metrics"].pop("tokens_per_second", None)
    return {"records": records, **values}


def multi_lora_model() -> Any:
    from scenarios import tiny_config

    from twinkle import DeviceMesh
    from twinkle.model import MultiLoraTransformersModel

    torch.manual_seed(0)
    model = MultiLoraTransformersModel(config=tiny_config("qwen2"), mixed_precision="no", max_loras=2, max_r=8,
                                       strategy="native_fsdp", device_mesh=DeviceMesh.from_sizes(world_size=2))
    model.multi_lora.acquire_lora("t", lora_config())
    model.set_optimizer("AdamW", lr=1e-2, adapter_name="t")
    return model


def main() -> None:
    global SPY
    out = Path(sys.argv[1])
    SPY = fake_accelerator.install()
    twinkle.initialize(seed=0, timeout_s=120, device=fake_accelerator.DEVICE)
    rank = collective.rank()
    parts = {
        "layer": lambda: layer_checks(out),
        "ddp_full": lambda: phases(build("native_fsdp", fsdp=1), None, out, "ddp_full"),
        "fsdp2_lora": lambda: phases(build("native_fsdp", fsdp=2, lora=True), "a", out, "fsdp2_lora"),
        "multi_lora": lambda: phases(multi_lora_model(), "t", out, "multi_lora"),
    }
    results: dict[str, Any] = {}
    for name, run in parts.items():
        try:
            results[name] = run()
        except Exception:
            results[name] = {"error": traceback.format_exc()}
    results["comm_device"] = str(collective.comm_device())
    torch.save(results, out / f"placement.rank{rank}.pt")


if __name__ == "__main__":
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    main()
