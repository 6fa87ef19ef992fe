"""Dataset.encode throughput with images (VL template, tiny Qwen2.5-VL processor) vs the same rows text-only.

Both runs encode the same generated "What colour is the shape?" conversations with the same
tokenizer: text-only through Qwen2_5Template (the image tag left as text), with images through
Qwen2_5VLTemplate (the processor sizes every image to expand its tokens; pixels are discarded and
recomputed at collate time). Also reported: the Arrow bytes per encoded row (paths/bytes only) and
what storing the pixel values would have cost, and collate throughput (rows/s through the
MediaCollator). Ratios matter, not absolute seconds (shared machine).

    python bench/bench_encode_vl.py [--rows 512] [--size 64]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

from twinkle.dataset import Dataset, DatasetMeta  # noqa: E402
from twinkle.multimodal.shapes import shape_rows  # noqa: E402
from twinkle.preprocessor import MessagesProcessor  # noqa: E402
from twinkle.processor import InputProcessor  # noqa: E402

MODEL = "twinkle://tiny-qwen2.5-vl"


def encode(rows: list[dict], template: str) -> tuple[Dataset, float]:
    dataset = Dataset(DatasetMeta(data=rows))
    dataset.set_template(template, model_id=MODEL)
    _ = dataset.template.tokenizer  # load outside the timed part
    start = time.perf_counter()
    dataset.encode()
    return dataset, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    args = parser.parse_args()
    raw = shape_rows(args.rows, seed=0, size=args.size)
    text_rows = [{"messages": r["messages"]} for r in raw]
    vl_data = Dataset(DatasetMeta(data=[{"messages": r["messages"], "images": r["images"]} for r in raw]))
    vl_rows = vl_data.map(MessagesProcessor()).get_rows(range(args.rows))  # the standard format, media stored
    text, text_s = encode(text_rows, "Qwen2_5Template")
    vl, vl_s = encode(vl_rows, "Qwen2_5VLTemplate")
    collate = InputProcessor.for_template(vl.template)
    batches = [vl.get_rows(range(i, min(i + 8, len(vl)))) for i in range(0, len(vl), 8)]
    start = time.perf_counter()
    pixel_bytes = sum(collate(b)["pixel_values"].numel() * 4 for b in batches)
    collate_s = time.perf_counter() - start
    result = {
        "rows": args.rows, "image_side": args.size,
        "encode_rows_per_s_text_only": round(args.rows / text_s, 1),
        "encode_rows_per_s_with_images": round(args.rows / vl_s, 1),
        "encode_slowdown_with_images": round(vl_s / text_s, 2),
        "collate_rows_per_s_with_images": round(args.rows / collate_s, 1),
        "arrow_bytes_per_row_text_only": round(text.hf_dataset.data.nbytes / args.rows),
        "arrow_bytes_per_row_with_images": round(vl.hf_dataset.data.nbytes / args.rows),
        "pixel_values_bytes_per_row_if_stored": round(pixel_bytes / args.rows),
        "tokens_per_row_text_only": round(sum(text.hf_dataset["length"]) / args.rows, 1),
        "tokens_per_row_with_images": round(sum(vl.hf_dataset["length"]) / args.rows, 1),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
