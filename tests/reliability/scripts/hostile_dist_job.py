"""torchrun job (2 ranks, FSDP2 LoRA): hostile checkpoints are refused on every rank together, nothing changes,
nothing hangs, and no pickle runs.

Usage: torchrun --nproc_per_node=2 hostile_dist_job.py OUT_DIR
Writes OUT_DIR/hostile.rank<r>.pt (a dict of outcomes), or OUT_DIR/hostile.rank<r>.error with the traceback.
"""

from __future__ import annotations

import pickle
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "distributed" / "scripts"))
from scenarios import build, global_batches, local_rows, rank_world, trainable_state  # noqa: E402

import twinkle  # noqa: E402
from twinkle import collective  # noqa: E402
from twinkle.checkpoint import CheckpointError, capture_rng_state, torch_save  # noqa: E402


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('pwned')",))


def step(model: Any, batch: dict[str, torch.Tensor]) -> None:
    rank, world = rank_world()
    model.forward_backward(inputs=local_rows(batch, rank, world), adapter_name="a")
    model.clip_grad_and_step(adapter_name="a")


def snapshot(model: Any) -> dict[str, Any]:
    """Full trainable weights (a collective), this rank's optimizer moments and the torch generator."""
    optimizer = model.optimizer_group["a"].optimizer
    moments = {f"{i}.{k}": (v.to_local() if hasattr(v, "to_local") else v).clone()
               for i, state in enumerate(optimizer.state.values()) for k, v in state.items()}
    return {"weights": trainable_state(model, "a"), "moments": moments, "rng": torch.get_rng_state(),
            "step": model.optimizer_group["a"].cur_step}


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a["step"] == b["step"] and torch.equal(a["rng"], b["rng"])
            and all(torch.equal(a["weights"][k], b["weights"][k]) for k in a["weights"])
            and all(torch.equal(a["moments"][k], b["moments"][k]) for k in a["moments"]))


def refused(model: Any, call: Any) -> str:
    """The error message of ``call`` (which must raise), after checking the model did not change."""
    before = snapshot(model)
    try:
        call()
    except (CheckpointError, RuntimeError) as exc:
        message = f"{type(exc).__name__}: {exc}"
    else:
        message = "NO ERROR"
    collective.barrier()
    return message if same(snapshot(model), before) else f"CHANGED after: {message}"


def damaged_copy(good: Path, name: str, damage: Any) -> Path:
    rank, _ = rank_world()
    target = good.parent / name
    if rank == 0:
        shutil.copytree(good, target)
        damage(target)
    collective.barrier()
    return target


def main() -> None:
    out = Path(sys.argv[1])
    twinkle.initialize(seed=0, timeout_s=90)
    rank, _ = rank_world()
    result: dict[str, Any] = {}
    model = build("native_fsdp", fsdp=2, lora=True)
    batches = global_batches(3)
    step(model, batches[0])
    good = Path(model.save("good", output_dir=str(out), adapter_name="a", save_optimizer=True))
    saved = snapshot(model)
    step(model, batches[1])

    marker = out / "pwned"
    evil = damaged_copy(good, "evil", lambda d: (d / "dcp_model" / ".metadata").write_bytes(
        pickle.dumps(Payload(marker))))
    result["evil_metadata"] = refused(model, lambda: model.resume_from_checkpoint(str(evil), adapter_name="a"))
    result["pwned"] = marker.exists()

    def bad_rank1_rng(d: Path) -> None:
        state = capture_rng_state()
        state["torch"] = torch.zeros(5, dtype=torch.uint8)
        torch_save(state, d / "rng_state.rank1.pt")

    bad_rng = damaged_copy(good, "bad_rng", bad_rank1_rng)
    result["bad_rank1_rng"] = refused(model, lambda: model.resume_from_checkpoint(str(bad_rng), adapter_name="a"))

    if rank == 0:
        (out / "user_project").mkdir()
        (out / "user_project" / "notes.md").write_text("mine")
    collective.barrier()
    result["user_dir"] = refused(model, lambda: model.save("user_project", output_dir=str(out), adapter_name="a"))
    result["user_file_kept"] = (out / "user_project" / "notes.md").is_file()

    param = model.backend.parameters(model.optimizer_group["a"])[0]
    local = param.to_local() if hasattr(param, "to_local") else param
    kept = local.detach().clone()
    if rank == 1 and local.numel():
        with torch.no_grad():
            local.view(-1)[0] = float("nan")
    result["nan_on_rank1"] = refused(model, lambda: model.save("nan", output_dir=str(out), adapter_name="a"))
    result["nan_dir_exists"] = (out / "nan").exists()
    with torch.no_grad():
        local.copy_(kept)

    model.resume_from_checkpoint(str(good), adapter_name="a")
    resumed = snapshot(model)
    result["good_resume_weights"] = all(torch.equal(resumed["weights"][k], saved["weights"][k])
                                        for k in saved["weights"])
    torch.save(result, out / f"hostile.rank{rank}.pt")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        rank = int(__import__("os").environ.get("RANK", "0"))
        (Path(sys.argv[1]) / f"hostile.rank{rank}.error").write_text(traceback.format_exc())
        raise
