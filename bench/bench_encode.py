"""Encoding throughput: twinkle's Dataset.encode vs a bare tokenizer.apply_chat_template loop.

Same rows, same (embedded) tokenizer, one run, side by side. Prints one JSON object:
rows/s of the bare loop, of ``Dataset.encode()`` single-process and with ``num_proc=2``, and the
time ratios twinkle/bare (target: <= 1.2 single-process, < 1.0 with two processes).

    python bench/bench_encode.py [--rows 20000] [--seed 0]

The bare loop only tokenizes; twinkle also validates every conversation, computes the label
mask and writes Arrow columns. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time

os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

WORDS_EN = ("the model reads data and learns from every conversation while the trainer saves a checkpoint "
            "after each epoch please explain how a tokenizer splits text into pieces quickly").split()
WORDS_ZH = list("训练数据模型学习对话检查点分词器文本快速解释每一个轮次保存")


def synthetic_rows(n: int, seed: int) -> list[dict]:
    """Multi-turn conversations (1-4 exchanges, optional system turn), English and Chinese."""
    rng = random.Random(seed)

    def text(lo: int, hi: int) -> str:
        if rng.random() < 0.3:
            return "".join(rng.choice(WORDS_ZH) for _ in range(rng.randint(lo, hi)))
        return " ".join(rng.choice(WORDS_EN) for _ in range(rng.randint(lo, hi))).capitalize() + "."

    rows = []
    for _ in range(n):
        messages = [{"role": "system", "content": text(4, 12)}] if rng.random() < 0.5 else []
        for _ in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": text(5, 30)})
            messages.append({"role": "assistant", "content": text(10, 60)})
        rows.append({"messages": messages})
    return rows


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=2, help="interleaved rounds; the best time of each counts")
    args = parser.parse_args()

    import datasets

    from twinkle.dataset import Dataset, DatasetMeta
    from twinkle.template import Template

    datasets.disable_progress_bars()
    rows = synthetic_rows(args.rows, args.seed)
    template = Template()
    tokenizer = template.tokenizer
    tokenizer.apply_chat_template(rows[0]["messages"], tokenize=True)  # warm the compiled template

    def bare() -> None:
        for row in rows:
            tokenizer.apply_chat_template(row["messages"], tokenize=True)

    def twinkle(num_proc: int | None) -> Dataset:
        ds = Dataset(DatasetMeta(data=rows))
        ds.set_template(template)
        seconds = timed(lambda: ds.encode(num_proc=num_proc))
        ds.seconds = seconds
        return ds

    load_before = os.getloadavg()[0]
    bare_s = one_s = two_s = float("inf")
    for _ in range(args.repeats):  # interleaved, so a busy moment on the machine hits every variant
        bare_s = min(bare_s, timed(bare))
        one = twinkle(None)
        one_s = min(one_s, one.seconds)
        two = twinkle(2)
        two_s = min(two_s, two.seconds)
    tokens = sum(one.hf_dataset["length"])
    trained = sum(sum(1 for t in labels if t != -100) for labels in one.hf_dataset["labels"])
    assert list(one.hf_dataset["input_ids"]) == list(two.hf_dataset["input_ids"])
    print(json.dumps({
        "rows": args.rows,
        "tokens": tokens,
        "trained_tokens": trained,
        "bare_apply_chat_template_rows_per_s": round(args.rows / bare_s, 1),
        "twinkle_encode_rows_per_s": round(args.rows / one_s, 1),
        "twinkle_encode_num_proc2_rows_per_s": round(args.rows / two_s, 1),
        "ratio_twinkle_over_bare_time": round(one_s / bare_s, 3),
        "ratio_twinkle_num_proc2_over_bare_time": round(two_s / bare_s, 3),
        "repeats": args.repeats,
        "cpus": os.cpu_count(),
        "load_average_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "python": platform.python_version(),
    }, indent=2))


if __name__ == "__main__":
    main()
