"""The data path's costs, in one JSON: loader re-entry, packed vs padded training, streaming vs up-front encode.

``reentry``: DataLoader overhead per training step on a large dataset, the order cached per epoch vs
recomputed per step. The Trainer takes one batch per ``for batch in loader`` and re-enters the loader every step. The
old algorithm (reimplemented here as ``before``) drew the epoch's permutation of every row and
turned it into a Python list on every entry; the DataLoader (``after``) draws it once per epoch and
keeps it as a NumPy array. Both run side by side in one process on the same synthetic dataset
(rows cost nothing to fetch, so only the loader's own work is measured), yield the same batches
(checked), and the JSON gives milliseconds per step and the ratio.

``packing``: tokens/s of a training loop (forward, backward, SGD step of the tiny Qwen2 model built
from its config) on the same variable-length rows, padded batches vs packs (best-fit packs of
``--pack-length`` tokens through ``InputProcessor(padding_free=True)``). Tokens counted are real
(non-pad) tokens, the same rows in both loops.

``streaming``: rows/s and time to the first batch of ``IterableDataset`` (map + encode on the fly)
vs ``Dataset`` (``datasets.map`` of the whole corpus up front, then read), on a generated jsonl
corpus, with the embedded tokenizer.

    python bench/bench_dataloader.py [--section all|reentry|packing|streaming] [--rows 10000000] ...

Not a test: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from typing import Any

import numpy as np


class Rows:
    """A dataset of ``n`` rows whose fetch costs nothing (``get_rows`` like twinkle's Dataset)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, int]:
        return {"i": i}

    def get_rows(self, indices: list[int]) -> list[dict[str, int]]:
        return [{"i": i} for i in indices]


class BeforeLoader:
    """The previous algorithm: every entry draws the epoch's permutation and lists all of it."""

    def __init__(self, rows: Rows, batch_size: int, seed: int) -> None:
        self.rows, self.batch_size, self.seed, self.consumed = rows, batch_size, seed, 0

    def __iter__(self) -> Any:
        n, b = len(self.rows), self.batch_size
        per_epoch = n // b * b
        epoch, within = divmod(self.consumed, per_epoch)
        order = np.random.default_rng([self.seed, epoch]).permutation(n).tolist()
        for batch in range(within // b, n // b):
            indices = order[batch * b:(batch + 1) * b]
            self.consumed += len(indices)
            yield self.rows.get_rows(indices)


def per_step_ms(loader: Any, steps: int) -> tuple[list[float], list[list[int]]]:
    """Milliseconds of each step's ``next batch`` (a fresh ``for`` each step, as the Trainer does)."""
    times, seen = [], []
    for _ in range(steps):
        start = time.perf_counter()
        batch = next(iter(loader))  # what ``for batch in loader: ... break`` does each Trainer step
        times.append((time.perf_counter() - start) * 1000)
        seen.append([row["i"] for row in batch])
    return times, seen


def reentry(args: argparse.Namespace) -> dict[str, Any]:
    from twinkle.dataloader import DataLoader
    from twinkle.mesh import DeviceMesh

    rows = Rows(args.rows)
    before_ms, before_batches = per_step_ms(BeforeLoader(rows, args.batch_size, args.seed), args.steps)
    after = DataLoader(rows, batch_size=args.batch_size, seed=args.seed, device_mesh=DeviceMesh())
    after_ms, after_batches = per_step_ms(after, args.steps)
    if before_batches != after_batches:
        raise SystemExit("the two loaders yielded different batches: the comparison is meaningless")
    steady_before, steady_after = statistics.median(before_ms[1:]), statistics.median(after_ms[1:])
    return {
        "rows": args.rows, "steps": args.steps, "batch_size": args.batch_size,
        "before_ms_per_step": round(steady_before, 3),
        "after_ms_per_step": round(steady_after, 3),
        "after_first_step_ms": round(after_ms[0], 3),
        "before_first_step_ms": round(before_ms[0], 3),
        "per_step_speedup": round(steady_before / steady_after, 1),
        "same_batches": True,
    }


def packing(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from twinkle.assets import asset_path
    from twinkle.dataset.packing import pack_lengths, pack_row
    from twinkle.processor import InputProcessor

    rng = np.random.default_rng(args.seed)
    lengths = np.clip(rng.lognormal(5.0, 0.9, args.pack_rows), 16, args.pack_length).astype(int)
    rows = [{"input_ids": rng.integers(3, 2000, n).tolist(), "labels": rng.integers(3, 2000, n).tolist()}
            for n in lengths]
    order = rng.permutation(len(rows)).tolist()
    padded = [InputProcessor()([rows[i] for i in order[k:k + args.pad_batch]])
              for k in range(0, len(rows), args.pad_batch)]
    packs = [pack_row([rows[i] for i in members]) for members in pack_lengths(lengths.tolist(), args.pack_length)]
    packed = [InputProcessor(padding_free=True)(packs[k:k + 1]) for k in range(len(packs))]

    def tokens_per_s(batches: list[dict[str, Any]]) -> float:
        torch.manual_seed(0)
        config = AutoConfig.from_pretrained(asset_path("tiny-qwen"))
        config._attn_implementation = "sdpa"
        model = AutoModelForCausalLM.from_config(config)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        start = time.perf_counter()
        for batch in batches:
            model(**batch, use_cache=False).loss.backward()
            opt.step()
            opt.zero_grad()
        return int(lengths.sum()) / (time.perf_counter() - start)

    padded_tps, packed_tps = tokens_per_s(padded), tokens_per_s(packed)
    slots = sum(b["input_ids"].numel() for b in padded)
    return {"rows": len(rows), "mean_length": round(float(lengths.mean()), 1), "max_length": int(lengths.max()),
            "pad_batch": args.pad_batch, "pack_length": args.pack_length, "packs": len(packs),
            "pack_fill_ratio": round(float(lengths.sum()) / (len(packs) * args.pack_length), 4),
            "padded_real_token_share": round(float(lengths.sum()) / slots, 4),
            "padded_tokens_per_s": round(padded_tps), "packed_tokens_per_s": round(packed_tps),
            "packed_over_padded": round(packed_tps / padded_tps, 2)}


def streaming(args: argparse.Namespace) -> dict[str, Any]:
    import os
    import tempfile

    from twinkle.dataloader import DataLoader
    from twinkle.dataset import Dataset, DatasetMeta, IterableDataset
    from twinkle.mesh import DeviceMesh
    from twinkle.template import Template

    def messages(row: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": row["q"]}, {"role": "assistant", "content": row["a"]}]}

    template = Template()
    _ = template.tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "corpus.jsonl")
        with open(path, "w") as f:
            f.writelines(json.dumps({"q": f"question {i} " * (1 + i % 7), "a": f"answer {i} " * (1 + i % 5)}) + "\n"
                         for i in range(args.stream_rows))
        results = {}
        for name in ("upfront", "stream"):
            start = time.perf_counter()
            if name == "upfront":
                dataset: Any = Dataset(DatasetMeta(path)).map(messages, batched=False)
            else:
                dataset = IterableDataset(DatasetMeta(path)).map(messages, batched=False)
            dataset.set_template(template)
            dataset.encode()
            loader = DataLoader(dataset, batch_size=32, shuffle=False, device_mesh=DeviceMesh())
            first, n = None, 0
            for batch in loader:
                first = first if first is not None else time.perf_counter() - start
                n += len(batch)
            results[name] = {"rows_per_s": round(n / (time.perf_counter() - start)),
                             "first_batch_s": round(first, 3)}
    return {"rows": args.stream_rows, **results,
            "stream_over_upfront_rows_per_s": round(results["stream"]["rows_per_s"] /
                                                    results["upfront"]["rows_per_s"], 2),
            "first_batch_speedup": round(results["upfront"]["first_batch_s"] / results["stream"]["first_batch_s"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--section", choices=["all", "reentry", "packing", "streaming"], default="all")
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pack-rows", type=int, default=256, help="rows trained on, padded and packed")
    parser.add_argument("--pack-length", type=int, default=1024)
    parser.add_argument("--pad-batch", type=int, default=8)
    parser.add_argument("--stream-rows", type=int, default=20_000)
    args = parser.parse_args()
    sections = {"reentry": reentry, "packing": packing, "streaming": streaming}
    out: dict[str, Any] = {name: fn(args) for name, fn in sections.items() if args.section in ("all", name)}
    out.update({"machine": platform.machine(), "python": platform.python_version()})
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
