"""Sequence parallelism (cp=2, Ulysses) vs one process on the same long row: activations saved per rank, step time.

Per rank, the bytes of the tensors a training forward saves for its backward (parameters excluded: what the
sequence split divides), and the median time of a full step (forward, backward, SGD), each side by side with
one process on the same row and printed as ratios. Every process runs one thread: on a 2-core CPU machine the
time ratio reads the split's parallel gain on two cores (each rank computes half of every layer, attention
included) less the exchanges' cost.

    python bench/bench_sequence_parallel.py [--seq 4096] [--steps 3]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def build(world: int, seq: int):
    from transformers import Qwen2Config

    from twinkle import DeviceMesh
    from twinkle.model import TransformersModel

    config = Qwen2Config(hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=8,
                         num_key_value_heads=4, vocab_size=4096, max_position_embeddings=seq,
                         tie_word_embeddings=False, pad_token_id=0)
    torch.manual_seed(0)
    mesh = DeviceMesh.from_sizes(cp_size=world, world_size=world) if world > 1 else None
    model = TransformersModel(config=config, mixed_precision="no", device_mesh=mesh)
    model.set_optimizer("SGD", lr=1e-3)
    return model


def saved_bytes(model, batch: dict[str, torch.Tensor]) -> int:
    """Distinct storages a training forward saves for backward, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.forward(inputs=batch)
    return sum(seen.values())


def measure(seq: int, steps: int) -> dict[str, float]:
    world = int(os.environ.get("WORLD_SIZE", 1))
    model = build(world, seq)
    ids = torch.randint(3, 4096, (1, seq), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "labels": ids.clone()}
    activations = saved_bytes(model, batch)
    times = []
    for _ in range(steps + 1):  # the first step warms up
        start = time.perf_counter()
        model.forward_backward(inputs=batch)
        model.clip_grad_and_step()
        times.append(time.perf_counter() - start)
    return {"activation_bytes": activations, "step_s": statistics.median(times[1:]),
            "loss": float(model.calculate_metric(is_training=True)["loss"])}


def worker(args: argparse.Namespace) -> None:
    import twinkle

    twinkle.initialize(seed=0)
    result = measure(args.seq, args.steps)
    if int(os.environ.get("RANK", 0)) == 0:
        Path(args.out).write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    env = {**os.environ, "TWINKLE_DEVICE": "cpu", "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error"}
    os.environ.update({k: env[k] for k in ("TWINKLE_DEVICE", "OMP_NUM_THREADS")})
    torch.set_num_threads(1)
    single = measure(args.seq, args.steps)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sp2.json"
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                        __file__, "--worker", "--seq", str(args.seq), "--steps", str(args.steps), "--out", str(out)],
                       env=env, check=True, capture_output=True, text=True)
        split = json.loads(out.read_text())
    print(json.dumps({"seq": args.seq, "single": single, "sp2_rank0": split,
                      "activation_ratio": split["activation_bytes"] / single["activation_bytes"],
                      "step_time_ratio": split["step_s"] / single["step_s"],
                      "loss_rel_diff": abs(split["loss"] - single["loss"]) / abs(single["loss"])}, indent=1))


if __name__ == "__main__":
    main()
