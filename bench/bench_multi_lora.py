"""Multi-tenant LoRA: one MultiLoraTransformersModel vs K separate TransformersModel instances.

For K = 1, 2, 4, 8 tenants on one ~20M-parameter Qwen2-style base (random init from a config):

* ``separate``: K TransformersModel instances, one LoRA each, stepped one after another;
* ``time_shared``: one MultiLoraTransformersModel (max_loras=8, max_r=16), tenants stepped one after another;
* ``batched``: the same model, all K tenants in one ``forward_backward_multi`` per step.

Each (mode, K) runs in a fresh subprocess, so peak memory is its own: ``torch.cuda.max_memory_allocated``
on a GPU, peak RSS (``ru_maxrss``) minus the RSS after imports on the CPU. Tokens/s counts real tokens
of every tenant over the timed steps (after warm-up). Prints one JSON object with the runs and the ratios
(targets: memory(4 tenants) <= 1.15 x memory(1 tenant) for the multi-LoRA model;
batched >= 1.3 x time-shared throughput at K=4 with small per-tenant batches). Not a test: nothing asserts.
The batched step runs each LoRA layer as two matmuls over all tenants' rows (twinkle_hf.multi_lora.grouped).

    python bench/bench_multi_lora.py [--rows 2] [--length 64] [--steps 5] [--ks 1,2,4,8] [--repeats 3]
                                     [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

KS = (1, 2, 4, 8)
#: glibc serves allocations above its mmap threshold (at most 32 MiB) with a fresh mmap, so every (rows x seq x
#: vocab) logits tensor of a batched step (65 MB at K=4) page-faults its memory in again at each step while the
#: time-shared step's 16 MB ones are reused from the heap; one heap for both modes compares the steps, not the
#: allocator. Every child gets the same settings.
HEAP = {"MALLOC_MMAP_THRESHOLD_": str(1 << 32), "MALLOC_TRIM_THRESHOLD_": str(1 << 36)}
MODES = ("separate", "time_shared", "batched")


def base_config():
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=256, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=32000, max_position_embeddings=512,
                       tie_word_embeddings=False, pad_token_id=0)


def batch(seed: int, rows: int, length: int) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 32000, (rows, length), generator=gen)
    labels = ids.clone()
    labels[:, :4] = -100
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}


def child(mode: str, k: int, rows: int, length: int, steps: int, device: str) -> dict:
    import torch
    from peft import LoraConfig

    import twinkle.model as tm

    os.environ["TWINKLE_DEVICE"] = device
    cuda = device == "cuda"
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    torch.manual_seed(0)
    config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")
    tenants = [f"t{i}" for i in range(k)]
    if mode == "separate":
        models = {t: tm.TransformersModel(config=base_config(), mixed_precision="no") for t in tenants}
        for t, m in models.items():
            m.add_adapter_to_model(t, config)
            m.set_optimizer("AdamW", lr=1e-4, adapter_name=t)
    else:
        shared = tm.MultiLoraTransformersModel(config=base_config(), mixed_precision="no", max_loras=8, max_r=16)
        models = {t: shared for t in tenants}
        for t in tenants:
            shared.multi_lora.acquire_lora(t, config)
            shared.set_optimizer("AdamW", lr=1e-4, adapter_name=t)
    params = sum(p.numel() for p in next(iter(models.values())).model.parameters())

    def one_step(step: int) -> None:
        batches = {t: batch(step * 100 + i, rows, length) for i, t in enumerate(tenants)}
        if mode == "batched":
            models[tenants[0]].forward_backward_multi(batches)
        else:
            for t in tenants:
                models[t].forward_backward(inputs=batches[t], adapter_name=t)
        for t in tenants:
            models[t].clip_grad_and_step(adapter_name=t)

    for step in range(2):
        one_step(step)
    if cuda:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for step in range(2, 2 + steps):
        one_step(step)
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if cuda:
        peak_mb = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024  # KiB on Linux
    tokens_per_s = k * rows * length * steps / elapsed
    return {"mode": mode, "k": k, "peak_mb": round(peak_mb, 1), "tokens_per_s": round(tokens_per_s, 1),
            "base_params_m": round(params / 1e6, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2, help="rows per tenant per step")
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    parser.add_argument("--ks", default=",".join(map(str, KS)), help="tenant counts, comma-separated (1 and 4 "
                        "are needed for the memory ratios)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each (mode, K), interleaved; the best "
                        "tokens/s and the lowest peak memory are kept (on a shared machine the other load "
                        "changes between runs, and interleaving gives the modes the same conditions)")
    parser.add_argument("--child", nargs=2, metavar=("MODE", "K"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]), args.rows, args.length, args.steps, args.device)))
        return
    ks = [int(k) for k in args.ks.split(",")]
    best: dict[tuple[str, int], dict] = {}
    for _ in range(args.repeats):
        for k in ks:
            for mode in MODES:
                if mode == "batched" and k == 1:
                    continue
                out = subprocess.run([sys.executable, __file__, "--child", mode, str(k), "--rows", str(args.rows),
                                      "--length", str(args.length), "--steps", str(args.steps), "--device",
                                      args.device], capture_output=True, text=True, check=True,
                                     env={**os.environ, "HF_HUB_OFFLINE": "1", **HEAP})
                run = json.loads(out.stdout.strip().splitlines()[-1])
                kept = best.setdefault((mode, k), run)
                kept["tokens_per_s"] = max(kept["tokens_per_s"], run["tokens_per_s"])
                kept["peak_mb"] = min(kept["peak_mb"], run["peak_mb"])
    runs = list(best.values())
    by = {(r["mode"], r["k"]): r for r in runs}
    ratios = {}
    if 1 in ks and 4 in ks:
        ratios["multi_memory_k4_over_k1"] = round(by["time_shared", 4]["peak_mb"] / by["time_shared", 1]["peak_mb"],
                                                  3)
        ratios["separate_memory_k4_over_k1"] = round(by["separate", 4]["peak_mb"] / by["separate", 1]["peak_mb"], 3)
    if 8 in ks:
        ratios["separate_over_multi_memory_k8"] = round(by["separate", 8]["peak_mb"] / by["time_shared", 8]["peak_mb"],
                                                        3)
    for k in ks:
        if k > 1:
            ratios[f"batched_over_time_shared_tokens_k{k}"] = round(
                by["batched", k]["tokens_per_s"] / by["time_shared", k]["tokens_per_s"], 3)
    print(json.dumps({"device": args.device, "host": platform.machine(), "rows_per_tenant": args.rows,
                      "length": args.length, "steps": args.steps, "repeats": args.repeats, "runs": runs,
                      "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
