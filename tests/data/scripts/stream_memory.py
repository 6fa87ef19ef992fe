"""Stream a generated corpus through map + encode + pack + DataLoader; print the peak RSS growth as JSON.

Usage: python stream_memory.py ROWS WORK_DIR BATCHES. The corpus is written first (and its writing
memory released), then the peak is reset and measured from before the dataset is built, so a
pipeline that read or encoded the corpus up front would show it in the growth.
"""

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hf"))
from hf_testing import reset_peak_rss, status_mb  # noqa: E402

rows, work, batches = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
corpus = work / f"corpus-{rows}.jsonl"
words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
with open(corpus, "w") as f:
    for start in range(0, rows, 10_000):
        f.write("".join(f'{{"i": {i}, "q": "{" ".join(words[: 1 + i % 8])}", "a": "{words[i % 8]} {i}"}}\n'
                        for i in range(start, min(rows, start + 10_000))))

from twinkle.dataloader import DataLoader  # noqa: E402
from twinkle.dataset import DatasetMeta, IterablePackingDataset  # noqa: E402
from twinkle.processor import InputProcessor  # noqa: E402
from twinkle.template import Template  # noqa: E402

template = Template(max_length=256)
_ = template.tokenizer
import datasets  # noqa: E402, F401  (imported before the baseline: its import is not the pipeline's memory)
import torch  # noqa: E402, F401

baseline = reset_peak_rss()


def messages(row):
    return {"messages": [{"role": "user", "content": row["q"]}, {"role": "assistant", "content": row["a"]}]}


stream = IterablePackingDataset(DatasetMeta(str(corpus)), packing_interval=256).map(messages, batched=False)
stream.set_template(template)
stream.pack_dataset()
loader = DataLoader(stream, batch_size=4, shuffle_buffer=2000, processor=InputProcessor(padding_free=True))
tokens = 0
for _, batch in zip(range(batches), loader):
    tokens += batch["input_ids"].numel()
print(json.dumps({"rows": rows, "growth_mib": status_mb("VmHWM") - baseline, "tokens": tokens,
                  "fill_ratio": stream.pack_report.fill_ratio, "corpus_mib": os.path.getsize(corpus) / 2**20}))
