"""torchrun job (2 ranks, gloo): a full-weight sync of an FSDP2-sharded TransformersModel to a fake vLLM engine.

Usage: torchrun --nproc_per_node=2 weight_sync_job.py OUT_DIR
Every rank syncs to its own fake engine (bf16, 64 KiB buckets) and records what it was handed: the bytes of
each bucket, the dtypes, and the tensors (full, not this rank's shards). Writes OUT_DIR/sync.rank<r>.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the fake engine runs in this process

from hf_testing import tiny_config  # noqa: E402

import twinkle  # noqa: E402
from twinkle import DeviceMesh  # noqa: E402

BUCKET = 64 * 1024


class Engine:
    def __init__(self) -> None:
        self.llm_engine = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))
        self.calls: list[list[tuple[str, torch.Tensor]]] = []

    def apply_model(self, fn) -> None:
        model = torch.nn.Module()
        model.load_weights = lambda weights: self.calls.append(list(weights))
        fn(model)


def main() -> None:
    from twinkle.model import TransformersModel
    from twinkle_hf.sampler import VLLMSampler

    out = Path(sys.argv[1])
    twinkle.initialize(seed=0, timeout_s=120)
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = TransformersModel(config=tiny_config("qwen2", vocab_size=2048), strategy="native_fsdp",
                              device_mesh=DeviceMesh.from_sizes(fsdp_size=2), mixed_precision="no")
    model.set_optimizer("SGD", lr=0.1)
    sharded = sum(p.to_local().numel() for p in model.model.parameters())
    engine = Engine()
    VLLMSampler(engine=engine, adapter_dir=str(out / f"adapters{rank}"), sync_bucket_bytes=BUCKET).sync_weights(model)
    result = {"bucket_bytes": [sum(t.numel() * t.element_size() for _, t in call) for call in engine.calls],
              "dtypes": sorted({str(t.dtype) for call in engine.calls for _, t in call}),
              "tensors": {n: t for call in engine.calls for n, t in call}, "local_numel": sharded}
    torch.save(result, out / f"sync.rank{rank}.pt")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
