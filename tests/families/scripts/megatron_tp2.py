"""Run under ``torchrun --nproc_per_node=2`` (gloo): the family matrix's TP=2 checks in one launch.

For every MEGATRON_CPU family: MegatronModel at TP=2 (split weights) gives HF's logits. Then seed 001's
MegatronModel example on a Qwen 3.5 model at TP=2 (the mesh that fits two CPU ranks; Adam with eps 1). Rank N writes
rankN.json.

argv: <output dir> <json file: {name: model directory}>
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch.distributed as dist  # noqa: E402
from family_testing import SEED_PARITY_OPTIMIZER, logits_batch, max_logits_diff, seed_example  # noqa: E402

import twinkle  # noqa: E402
from twinkle import DeviceMesh  # noqa: E402
from twinkle.model import MegatronModel  # noqa: E402


def main() -> None:
    out, dirs = Path(sys.argv[1]), json.loads(Path(sys.argv[2]).read_text())
    mesh = DeviceMesh.from_sizes(tp_size=2)
    runtime = twinkle.initialize(global_device_mesh=mesh, seed=0)
    report: dict = {}
    batch = logits_batch()
    for name, path in dirs.items():
        model = MegatronModel(model_id=path, device_mesh=mesh, mixed_precision="no")
        report[f"{name}_logits"] = max_logits_diff(model.forward_only(inputs=batch)["logits"], Path(path), batch)
        report[f"{name}_vocab_rows"] = int(model.gpt.output_layer.weight.shape[0])
    report["seed"] = seed_example(Path(dirs["qwen3_5"]), out / "seed", mesh=mesh, **SEED_PARITY_OPTIMIZER)
    (out / f"rank{runtime.rank}.json").write_text(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
