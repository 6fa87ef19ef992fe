"""Ray-mode argument splitting and result collection, checked without Ray."""

from __future__ import annotations

import pytest
import torch

from twinkle import DeviceMesh
from twinkle.actors.dispatch import collect, plan_calls, split


def test_split_is_strided_like_the_dataloader_and_keeps_scalars():
    rows = list(range(6))
    assert split(rows, 2, "rows") == [rows[0::2], rows[1::2]]
    batch = {"x": torch.arange(6).reshape(6, 1), "name": "same", "ids": [[i] for i in range(6)]}
    parts = split(batch, 3, "batch")
    assert [p["x"].flatten().tolist() for p in parts] == [[0, 3], [1, 4], [2, 5]]
    assert all(p["name"] == "same" for p in parts)
    assert split(5, 2, "scalar") == [5, 5]
    with pytest.raises(ValueError, match="has 5 rows, which does not divide evenly over 2"):
        split(list(range(5)), 2, "rows")


def test_slice_dp_gives_tp_peers_the_same_rows():
    mesh = DeviceMesh.from_sizes(dp_size=2, tp_size=2)
    plan = plan_calls("slice_dp", "all", mesh, (list(range(4)),), {}, "f")
    assert [(rank, shard, args[0]) for rank, shard, args, _ in plan] == [
        (0, 0, [0, 2]), (1, 0, [0, 2]), (2, 1, [1, 3]), (3, 1, [1, 3])]
    first_only = plan_calls("all", "first", mesh, (7,), {"k": 1}, "f")
    assert first_only == [(0, None, (7,), {"k": 1})]


def test_collect_restores_row_order_and_counts_each_slice_once():
    # ranks 0,1 hold shard 0 (rows 0, 2); ranks 2,3 hold shard 1 (rows 1, 3)
    results = [[0, 2], [0, 2], [1, 3], [1, 3]]
    assert collect("flatten", results, shards=[0, 0, 1, 1]) == [0, 1, 2, 3]
    assert collect("sum", [1.0, 1.0, 2.0, 2.0], shards=[0, 0, 1, 1]) == 3.0
    assert collect("mean", [{"loss": 1.0}, {"loss": 3.0}]) == {"loss": 2.0}
    assert collect("list", [1, 2]) == [1, 2] and collect("first", [1, 2]) == 1 and collect("none", [1]) is None
    assert collect("flatten", [[1], [2, 3]]) == [1, 2, 3]
