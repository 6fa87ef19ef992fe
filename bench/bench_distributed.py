"""DDP and FSDP2 step time on 2 processes vs 1 process, same global batch; communication share.

On this 2-core CPU machine scaling is bounded by the cores, so the number to read is the overhead
a correctness-preserving distributed step adds, and how much of a step the collectives take
(from the torch profiler: every op whose name is a c10d/gloo/nccl collective). On a GPU machine the
same script reports tokens/s per device and an MFU estimate (6 * params * tokens / peak FLOPs).

    python bench/bench_distributed.py [--steps 6] [--rows 8] [--seq 128]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

COLLECTIVE_MARKERS = ("allreduce", "all_reduce", "reduce_scatter", "all_gather", "allgather", "broadcast",
                      "c10d", "gloo", "nccl")
PEAK_FLOPS = {"cuda": 989e12}  # H100/H200 bf16 dense; only used for the MFU estimate on GPU


def build(strategy_fsdp: int, world: int):
    from transformers import Qwen2Config

    from twinkle import DeviceMesh
    from twinkle.model import TransformersModel

    config = Qwen2Config(hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=4, vocab_size=4096, max_position_embeddings=512,
                         tie_word_embeddings=False, pad_token_id=0)
    torch.manual_seed(0)
    mesh = DeviceMesh.from_sizes(fsdp_size=strategy_fsdp if world > 1 else 1, world_size=world)
    model = TransformersModel(config=config, mixed_precision="no", strategy="native_fsdp", device_mesh=mesh)
    model.set_optimizer("AdamW", lr=1e-4)
    return model


def batch(rows: int, seq: int, rank: int, world: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 4096, (rows, seq), generator=gen)
    full = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    return {k: v[rank::world] for k, v in full.items()}


def worker(args: argparse.Namespace) -> None:
    import twinkle

    twinkle.initialize(seed=0)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    model = build(args.fsdp, world)
    data = batch(args.rows, args.seq, rank, world)

    def step() -> None:
        model.forward_backward(inputs=data)
        model.clip_grad_and_step()

    for _ in range(2):  # warm-up (lazy FSDP init, allocator)
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    step_s = (time.perf_counter() - start) / args.steps
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    comm = sum(e.self_cpu_time_total for e in events if any(m in e.key.lower() for m in COLLECTIVE_MARKERS))
    params = sum(p.numel() for p in model.model.parameters())  # a DTensor counts its global size
    tokens = args.rows * args.seq
    result = {"step_s": step_s, "comm_share": comm / total if total else 0.0, "tokens_per_s": tokens / step_s,
              "params": params}
    if torch.cuda.is_available():
        result["tokens_per_s_per_gpu"] = tokens / step_s / world
        result["mfu"] = 6 * params * tokens / step_s / world / PEAK_FLOPS["cuda"]
    if rank == 0:
        Path(args.out).write_text(json.dumps(result))


def launch(args: argparse.Namespace, nproc: int, fsdp: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={nproc}", __file__, "--worker", "--out", str(out), "--fsdp", str(fsdp),
                   "--steps", str(args.steps), "--rows", str(args.rows), "--seq", str(args.seq)]
        env = {**os.environ, "TWINKLE_DEVICE": os.environ.get("TWINKLE_DEVICE", "cpu"), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode:
            raise RuntimeError(f"bench worker failed:\n{proc.stderr[-3000:]}")
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--fsdp", type=int, default=1)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    single = launch(args, 1, 1)
    ddp = launch(args, 2, 1)
    fsdp = launch(args, 2, 2)
    report = {
        "machine": {"cpus": os.cpu_count(), "device": os.environ.get("TWINKLE_DEVICE", "cpu"),
                    "omp_threads_per_process": 1},
        "global_batch": {"rows": args.rows, "seq": args.seq},
        "single_process": single, "ddp_2proc": ddp, "fsdp2_2proc": fsdp,
        "ddp_vs_single_step_ratio": ddp["step_s"] / single["step_s"],
        "fsdp2_vs_single_step_ratio": fsdp["step_s"] / single["step_s"],
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
