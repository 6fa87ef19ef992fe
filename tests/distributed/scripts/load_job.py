"""torchrun job: host memory of loading and exporting a ~200M-parameter model under FSDP2 (2 ranks).

Usage: torchrun --nproc_per_node=2 load_job.py OUT_DIR
Rank 0 writes a ~200M-parameter Qwen2 checkpoint (fp32, one 0.8 GB safetensors file, odd vocabulary
so shards are uneven). Then every rank's peak RSS while building and wrapping the model (above its RSS
just before) for native FSDP2, accelerate's FSDP2 and LoRA + bf16; the peak of a full-model ``save``;
and every model's shards compared with a plain ``from_pretrained`` load (ranks take turns, so only
one full copy exists at a time).
Writes OUT_DIR/load.rank<r>.pt (OUT_DIR/load.rank<r>.error on failure).
"""

from __future__ import annotations

import functools
import gc
import sys
import traceback
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from edge_job import peak_rss_during  # noqa: E402
from scenarios import lora_config, rank_world, tiny_config  # noqa: E402

import twinkle  # noqa: E402
from twinkle import DeviceMesh  # noqa: E402

#: ~197M parameters: 16 layers of hidden 1024 / MLP 2816 (GQA 16:4 heads), vocabulary 8191, untied head.
BIG = {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 16, "num_attention_heads": 16,
       "num_key_value_heads": 4, "vocab_size": 8191}
WARM_UP = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "vocab_size": 129}


def write_checkpoint(path: Path, **sizes: int) -> None:
    """config.json + model.safetensors with seeded values, written tensor by tensor from a meta model's shapes."""
    from accelerate import init_empty_weights
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    config = tiny_config("qwen2", **(sizes or BIG))
    with init_empty_weights():
        shapes = {n: p.shape for n, p in AutoModelForCausalLM.from_config(config).named_parameters()}
    gen = torch.Generator().manual_seed(0)
    state = {n: torch.randn(shape, generator=gen) * 0.02 for n, shape in shapes.items()}
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(path))


def load(path: Path, strategy: str, lora: bool = False) -> Any:
    """Build and wrap (set_optimizer wraps; AdamW allocates its state at the first step, not here)."""
    from twinkle.model import TransformersModel

    model = TransformersModel(model_id=str(path), strategy=strategy, device_mesh=DeviceMesh.from_sizes(fsdp_size=2),
                              mixed_precision="bf16" if lora else "no")
    if lora:
        model.add_adapter_to_model("a", lora_config())
    model.set_optimizer("AdamW", lr=1e-4, adapter_name="a" if lora else None)
    return model


def mismatches_with_plain_load(models: dict[str, Any], path: Path) -> dict[str, list[str]]:
    """Per model, the names whose local shard differs from the same slice of ``from_pretrained`` (one plain load
    per rank, the ranks taking turns, so only one full copy exists at a time)."""
    from transformers import AutoModelForCausalLM

    from twinkle.collective import barrier, rank
    from twinkle_hf.distributed.shard_load import local_part
    from twinkle_hf.model.meta import file_key

    bad: dict[str, list[str]] = {name: [] for name in models}
    for turn in range(2):
        if rank() == turn:
            plain = dict(AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).named_parameters())
            for label, model in models.items():
                for name, param in model.model.named_parameters():
                    key = file_key(name)
                    if key in plain:
                        local, index = local_part(param)
                        if not torch.equal(local, plain[key].detach()[index].to(local.dtype)):
                            bad[label].append(name)
            del plain
            gc.collect()
        barrier()
    return bad


def main() -> None:
    out = Path(sys.argv[1])
    twinkle.initialize(seed=0, timeout_s=300)
    from twinkle.collective import barrier

    rank, _ = rank_world()
    path = out / "big_checkpoint"
    try:
        if rank == 0:
            write_checkpoint(path)
            write_checkpoint(out / "warm_up", **WARM_UP)
        barrier()
        for strategy in ("native_fsdp", "accelerate"):  # imports and one-time set-up are the process baseline
            load(out / "warm_up", strategy).save("warm_up_export", output_dir=str(out))
            gc.collect()
        full_bytes = (path / "model.safetensors").stat().st_size
        result: dict[str, Any] = {"full_bytes": full_bytes}
        models: dict[str, Any] = {}
        for label, strategy, lora in (("native_fsdp", "native_fsdp", False), ("accelerate", "accelerate", False),
                                      ("lora_bf16", "native_fsdp", True)):
            models[label], peak = peak_rss_during(lambda s=strategy, a=lora: load(path, s, a))
            result[label] = {"peak_mb": peak, "num_params": sum(p.numel() for p in models[label].model.parameters())}
        save = functools.partial(models["native_fsdp"].save, "export", output_dir=str(out))
        _, result["export_peak_mb"] = peak_rss_during(save)
        for label, names in mismatches_with_plain_load(models, path).items():
            result[label]["mismatches"] = names
        del models, save
        gc.collect()
        if rank == 0:
            result["export_equal"] = export_matches(path, out / "export")
        torch.save(result, out / f"load.rank{rank}.pt")
    except Exception:
        (out / f"load.rank{rank}.error").write_text(traceback.format_exc())
        raise


def export_matches(source: Path, export: Path) -> bool:
    """The full-model export holds exactly the loaded (untrained) weights, tensor by tensor."""
    from safetensors import safe_open

    from twinkle_hf.model.weights import weight_files

    exported = weight_files(export)
    with safe_open(str(source / "model.safetensors"), framework="pt") as original:
        for key in original.keys():
            with safe_open(str(exported[key]), framework="pt") as handle:
                if not torch.equal(handle.get_tensor(key), original.get_tensor(key)):
                    return False
    return True


if __name__ == "__main__":
    main()
