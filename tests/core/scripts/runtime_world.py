"""Run under torchrun: initialize, build the torch mesh, reduce, and report what each rank saw."""

import json
import os
import sys

import torch
import torch.distributed as dist

import twinkle
from twinkle import DeviceMesh

out_dir = sys.argv[1]
runtime = twinkle.initialize(global_device_mesh=DeviceMesh.from_sizes(dp_size=2), seed=1234)
torch_mesh = runtime.device_mesh.to_torch()
value = torch.tensor([float(runtime.rank + 1)])
dist.all_reduce(value)
report = {
    "rank": runtime.rank,
    "world_size": runtime.world_size,
    "backend": dist.get_backend(),
    "data_rank": runtime.data_rank,
    "mesh_dims": list(torch_mesh.mesh_dim_names),
    "mesh_shape": list(torch_mesh.mesh.shape),
    "all_reduce": value.item(),
    "first_random": torch.rand(1).item(),
    "placement": twinkle.get_device_placement(),
}
with open(os.path.join(out_dir, f"rank{runtime.rank}.json"), "w") as f:
    json.dump(report, f)
# no destroy_process_group: twinkle.initialize registered it at exit (gloo aborts without it)
