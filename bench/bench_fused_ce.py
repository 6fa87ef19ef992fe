"""Peak memory and time of the LM loss: materialised logits + cross-entropy vs the chunked fused path.

Not a test: prints one JSON object. Default shape is Qwen's vocab (151,936), hidden 1024, 4,096
tokens (a quarter of them with label -100, like prompt tokens), fp32, forward + backward of the
loss w.r.t. hidden states and lm_head weight.

    python bench/bench_fused_ce.py [--vocab 151936 --hidden 1024 --tokens 4096 --repeats 2]

CPU section: peak bytes of live tensors created during forward+backward (twinkle's
TensorMemoryTracker: a dispatch-mode allocation hook, no torch.cuda needed) and wall time
(median of --repeats interleaved runs after one tracked warm-up run each). Targets: peak <= 0.3x, time <= 1.3x.
CUDA section (only when a GPU is present): materialised vs torch chunked vs liger, with
torch.cuda peak memory and synchronised timings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from twinkle.kernel import TensorMemoryTracker, fused_linear_cross_entropy

MiB = 1 << 20


def make_inputs(args: argparse.Namespace, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.tokens, args.hidden, generator=g).to(device).requires_grad_()
    weight = (torch.randn(args.vocab, args.hidden, generator=g) * args.hidden ** -0.5).to(device).requires_grad_()
    labels = torch.randint(0, args.vocab, (args.tokens,), generator=g)
    labels[torch.rand(args.tokens, generator=g) < args.ignored_fraction] = -100  # untrained, like prompt tokens
    return hidden, weight, labels.to(device)


def materialised(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int | None) -> torch.Tensor:
    return F.cross_entropy((hidden @ weight.t()).float(), labels, ignore_index=-100)


def fused(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int | None) -> torch.Tensor:
    return fused_linear_cross_entropy(hidden, weight, labels, chunk_size=chunk).loss


def liger(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk: int | None) -> torch.Tensor:
    from twinkle_hf.kernels.liger_ops import fused_linear_cross_entropy as liger_flce

    return liger_flce(hidden, weight, labels).loss


def step(fn: Callable[..., torch.Tensor], hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
         chunk: int | None) -> float:
    hidden.grad = weight.grad = None
    loss = fn(hidden, weight, labels, chunk)
    loss.backward()
    return float(loss.detach())


def cpu_section(args: argparse.Namespace) -> dict[str, Any]:
    hidden, weight, labels = make_inputs(args, "cpu")
    paths = {"materialised": materialised, "fused": fused}
    result: dict[str, Any] = {}
    grads: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for name, fn in paths.items():  # one tracked run each: memory, gradients, and the warm-up
        with TensorMemoryTracker() as tracker:
            loss = step(fn, hidden, weight, labels, args.chunk_size)
        grads[name] = (hidden.grad, weight.grad)
        hidden.grad = weight.grad = None
        result[name] = {"loss": loss, "peak_MiB": round(tracker.peak_bytes / MiB, 1),
                        "largest_tensor_MiB": round(tracker.largest_bytes / MiB, 1),
                        "largest_tensor_shape": list(tracker.largest_shape), "times_s": []}
    result["max_abs_grad_diff"] = {
        "hidden": float((grads["fused"][0] - grads["materialised"][0]).abs().max()),
        "weight": float((grads["fused"][1] - grads["materialised"][1]).abs().max()),
    }
    del grads
    for _ in range(args.repeats):  # interleaved, so load from other processes hits both paths alike
        for name, fn in paths.items():
            start = time.perf_counter()
            step(fn, hidden, weight, labels, args.chunk_size)
            result[name]["times_s"].append(round(time.perf_counter() - start, 3))
    for name in paths:
        result[name]["time_s"] = round(statistics.median(result[name]["times_s"]), 3)
    mat, fus = result["materialised"], result["fused"]
    result["peak_memory_ratio"] = round(fus["peak_MiB"] / mat["peak_MiB"], 3)
    result["time_ratio"] = round(fus["time_s"] / mat["time_s"], 3)
    result["targets_met"] = {"peak_memory_ratio<=0.3": result["peak_memory_ratio"] <= 0.3,
                             "time_ratio<=1.3": result["time_ratio"] <= 1.3}
    return result


def cuda_section(args: argparse.Namespace) -> dict[str, Any]:
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA device"}
    hidden, weight, labels = make_inputs(args, "cuda")
    result: dict[str, Any] = {}
    for name, fn in (("materialised", materialised), ("torch_chunked", fused), ("liger", liger)):
        try:
            step(fn, hidden, weight, labels, args.chunk_size)  # warm-up (triton compile)
        except Exception as exc:  # liger missing or failing: report it, keep the rest
            result[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        times = []
        for _ in range(max(args.repeats, 3)):
            torch.cuda.synchronize()
            start = time.perf_counter()
            loss = step(fn, hidden, weight, labels, args.chunk_size)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        result[name] = {"loss": loss, "peak_MiB": round((torch.cuda.max_memory_allocated() - base) / MiB, 1),
                        "time_s": round(statistics.median(times), 4)}
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ignored-fraction", type=float, default=0.25,
                        help="share of labels set to -100 (the fused path skips those rows)")
    parser.add_argument("--chunk-size", type=int, default=None, help="rows per chunk (default: automatic)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    report = {
        "shape": {"vocab": args.vocab, "hidden": args.hidden, "tokens": args.tokens, "dtype": "float32",
                  "ignored_fraction": args.ignored_fraction},
        "torch": torch.__version__, "threads": torch.get_num_threads(),
        "cpu": cpu_section(args),
        "cuda": cuda_section(args),
    }
    json.dump(report, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
