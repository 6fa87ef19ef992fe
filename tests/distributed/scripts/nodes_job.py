"""The HSDP training run of a multi-node launch, and where each rank ran.

Usage: torchrun [--nnodes=2 --rdzv_backend=c10d ...] --nproc_per_node=2 nodes_job.py OUT_DIR hsdp_nodes
Writes OUT_DIR/hsdp_nodes.rank<r>.pt (train_job.py's layout): ``scenarios.train``'s result of full fine-tuning
on dp=2 x fsdp=2, plus this rank's node (torchrun's ``GROUP_RANK``, the launch it belongs to) and the global
ranks of its shard group (``fsdp``) and of its replica group (``dp``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from scenarios import SCENARIOS, build, global_batches, train  # noqa: E402
from train_job import main  # noqa: E402


def sc_hsdp_nodes() -> dict[str, Any]:
    import torch.distributed as dist

    model = build("native_fsdp", fsdp=2)
    result = train(model, global_batches())
    mesh = next(iter(model.model.parameters())).device_mesh  # the 2-D torch mesh the parameters live on
    result["node"] = int(os.environ["GROUP_RANK"])
    result["groups"] = {dim: dist.get_process_group_ranks(mesh.get_group(dim)) for dim in ("dp", "fsdp")}
    return result


if __name__ == "__main__":
    SCENARIOS["hsdp_nodes"] = sc_hsdp_nodes  # only here: the shared training launches never run it
    main()
