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
# a rank array in reverse order, through torch and back: its dp coordinates are the ranks reversed
reversed_mesh = DeviceMesh(mesh=[1, 0], mesh_dim_names=("dp",), device_type="cpu")
torch_reversed = reversed_mesh.to_torch_device_mesh()
back = DeviceMesh.from_torch(torch_reversed)
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
    "current_dp_rank": runtime.device_mesh.dp_rank,
    "reversed_dp_rank": reversed_mesh.dp_rank,
    "reversed_torch_coordinate": torch_reversed.get_coordinate(),
    "reversed_torch_ranks": torch_reversed.mesh.tolist(),
    "round_trip_equal": back == reversed_mesh and back.mesh.tolist() == [1, 0],
}
with open(os.path.join(out_dir, f"rank{runtime.rank}.json"), "w") as f:
    json.dump(report, f)
# no destroy_process_group: twinkle.initialize registered it at exit (gloo aborts without it)
