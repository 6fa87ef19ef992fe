"""A readable picture of where every rank sits in the mesh, for logs and bug reports."""

from __future__ import annotations

import os
import socket

from twinkle.mesh import DIMS
from twinkle.runtime import Runtime, get_runtime


def _device_label(runtime: Runtime, rank: int) -> str:
    if runtime.platform == "cpu":
        return "cpu"
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", runtime.world_size) or runtime.world_size)
    return f"{runtime.platform}:{rank % per_node}"


def get_device_placement(runtime: Runtime | None = None) -> str:
    """One line of header, then a table of rank -> device -> mesh coordinates -> data shard."""
    rt = runtime or get_runtime()
    mesh = rt.device_mesh
    header = (
        f"twinkle placement: mode={rt.mode} platform={rt.platform} world_size={rt.world_size} "
        f"host={socket.gethostname()} this_rank={rt.rank}\n{mesh.describe()}"
    )
    columns = ["rank", "device", *DIMS, "ep", "data"]
    rows = []
    for rank in range(mesh.world_size):
        coords = mesh.coords(rank)
        mark = "*" if rank == rt.rank else " "
        rows.append([f"{mark}{rank}", _device_label(rt, rank), *(str(coords[d]) for d in (*DIMS, "ep")),
                     str(mesh.data_rank_of(rank))])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = [header, "  ".join(c.rjust(w) for c, w in zip(columns, widths))]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths)) for row in rows]
    for group in rt.groups.values():
        lines.append(f"group {group.name!r}: ranks {list(group.ranks)} on {group.device_type}")
    return "\n".join(lines)
