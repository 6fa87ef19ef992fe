"""DataLoader overhead per training step on a large dataset: the order cached per epoch vs recomputed per step.

The Trainer takes one batch per ``for batch in loader`` and re-enters the loader every step. The
old algorithm (reimplemented here as ``before``) drew the epoch's permutation of every row and
turned it into a Python list on every entry; the DataLoader (``after``) draws it once per epoch and
keeps it as a NumPy array. Both run side by side in one process on the same synthetic dataset
(rows cost nothing to fetch, so only the loader's own work is measured), yield the same batches
(checked), and the JSON gives milliseconds per step and the ratio.

    python bench/bench_dataloader.py [--rows 10000000] [--steps 8] [--batch-size 64]

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from twinkle.dataloader import DataLoader
    from twinkle.mesh import DeviceMesh

    rows = Rows(args.rows)
    before_ms, before_batches = per_step_ms(BeforeLoader(rows, args.batch_size, args.seed), args.steps)
    after = DataLoader(rows, batch_size=args.batch_size, seed=args.seed, device_mesh=DeviceMesh())
    after_ms, after_batches = per_step_ms(after, args.steps)
    if before_batches != after_batches:
        raise SystemExit("the two loaders yielded different batches: the comparison is meaningless")
    steady_before, steady_after = statistics.median(before_ms[1:]), statistics.median(after_ms[1:])
    print(json.dumps({
        "rows": args.rows, "steps": args.steps, "batch_size": args.batch_size,
        "before_ms_per_step": round(steady_before, 3),
        "after_ms_per_step": round(steady_after, 3),
        "after_first_step_ms": round(after_ms[0], 3),
        "before_first_step_ms": round(before_ms[0], 3),
        "per_step_speedup": round(steady_before / steady_after, 1),
        "same_batches": True,
        "machine": platform.machine(), "python": platform.python_version(),
    }, indent=2))


if __name__ == "__main__":
    main()
