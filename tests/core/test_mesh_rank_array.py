"""DeviceMesh built from a rank array, its current-rank answers, and the rank array of a mesh from sizes."""

from __future__ import annotations

import itertools
import pickle
import sys
from dataclasses import replace

import numpy as np
import pytest

from twinkle import DeviceMesh, Platform
from twinkle.mesh import DIMS


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    # These tests read the launcher's environment, which Platform consults only before a process group
    # exists; a one-process group that an earlier test of this worker left initialised would answer instead.
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        monkeypatch.setattr(dist, "is_initialized", lambda: False)


def test_a_rank_array_gives_each_rank_the_coordinates_of_its_position():
    rng = np.random.default_rng(0)
    array = rng.permutation(24).reshape(2, 3, 4)  # any layout, not only arange
    mesh = DeviceMesh(mesh=array, mesh_dim_names=("tp", "dp", "pp"))
    assert (mesh.tp_size, mesh.dp_size, mesh.pp_size, mesh.world_size) == (2, 3, 4, 24)
    assert mesh.mesh_dim_names == ("tp", "dp", "pp") and np.array_equal(mesh.mesh, array)
    for tp, dp, pp in itertools.product(range(2), range(3), range(4)):
        rank = int(array[tp, dp, pp])
        got = mesh.coords(rank)
        assert (got["tp"], got["dp"], got["pp"], got["fsdp"], got["cp"]) == (tp, dp, pp, 0, 0)
        assert mesh.rank_of(tp=tp, dp=dp, pp=pp) == rank
        # its tp group: the ranks along the tp axis through its position
        assert sorted(mesh.group_ranks("tp", rank)) == sorted(int(r) for r in array[:, dp, pp])
        assert mesh.data_rank_of(rank) == dp


@pytest.mark.parametrize("sizes", [dict(dp_size=2, fsdp_size=3), dict(dp_size=2, tp_size=2, pp_size=2),
                                   dict(fsdp_size=2, cp_size=2, tp_size=2), dict(tp_size=4)])
def test_the_rank_array_of_a_mesh_from_sizes_agrees_with_its_coordinates(sizes):
    mesh = DeviceMesh.from_sizes(**sizes)
    given = [d for d in ("fsdp", "pp", "dp", "cp", "tp") if f"{d}_size" in sizes or d == "dp"]
    assert mesh.mesh_dim_names == tuple(given)
    array = mesh.mesh
    assert array.shape == tuple(mesh.size(d) for d in given) and sorted(array.reshape(-1)) == list(range(24))[
        :mesh.world_size]
    for index in itertools.product(*(range(n) for n in array.shape)):
        coords = mesh.coords(int(array[index]))
        assert all(coords[d] == i for d, i in zip(given, index))
    # and it rebuilds the same mesh: same ranks at the same coordinates
    again = DeviceMesh(mesh=array, mesh_dim_names=mesh.mesh_dim_names)
    assert all(again.coords(r) == mesh.coords(r) for r in range(mesh.world_size))


def test_current_rank_properties_follow_the_launchers_rank(monkeypatch):
    mesh = DeviceMesh(mesh=[[3, 1], [0, 2]], mesh_dim_names=("dp", "tp"))
    expected = {3: (0, 0), 1: (0, 1), 0: (1, 0), 2: (1, 1)}
    for rank, (dp, tp) in expected.items():
        monkeypatch.setenv("RANK", str(rank))
        assert Platform.get_rank() == rank
        assert (mesh.dp_rank, mesh.tp_rank, mesh.pp_rank, mesh.fsdp_rank) == (dp, tp, None, None)
        assert mesh.data_rank == dp and mesh.data_rank(0) == 1  # the property, and the call for any rank
    monkeypatch.setenv("RANK", "9")  # a process outside the mesh
    assert (mesh.dp_rank, mesh.tp_rank, mesh.data_rank) == (None, None, 0)
    assert (mesh.dp_world_size, mesh.tp_world_size, mesh.pp_world_size, mesh.world_size) == (2, 2, 1, 4)


def test_get_slice_splits_items_over_the_data_ranks():
    mesh = DeviceMesh.from_sizes(dp_size=3)
    parts = [list(range(10))[mesh.get_slice(10, rank=r)] for r in range(3)]
    assert parts == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_a_mesh_survives_pickle_replace_and_equality():
    mesh = DeviceMesh(mesh=[[1, 0], [3, 2]], mesh_dim_names=("pp", "tp"), ep_size=1)
    assert pickle.loads(pickle.dumps(mesh)) == mesh
    assert pickle.loads(pickle.dumps(mesh.data_rank)) == 0
    bigger = replace(DeviceMesh.from_sizes(dp_size=2), device_type="cpu")
    assert bigger.dp_size == 2 and bigger.mesh_dim_names == ("dp",) and bigger.device_type == "cpu"
    assert DeviceMesh(dp_size=2, tp_size=2).mesh_dim_names == ("dp", "tp")
    assert DeviceMesh() == DeviceMesh.from_sizes()


@pytest.mark.parametrize("kwargs, message", [
    (dict(mesh=[0, 1]), "needs mesh_dim_names="),
    (dict(mesh=[[0, 1]], mesh_dim_names=("dp",)), "has 2 axes .* mesh_dim_names has 1"),
    (dict(mesh=[0, 1], mesh_dim_names=("ep",)), "give ep_size="),
    (dict(mesh=[0, 1], mesh_dim_names=("xp",)), "distinct names from pp, dp, fsdp, cp, tp"),
    (dict(mesh=[0, 0], mesh_dim_names=("dp",)), "distinct non-negative integers"),
    (dict(mesh=[0.5, 1.0], mesh_dim_names=("dp",)), "integer ranks"),
    (dict(mesh=[0, 1], mesh_dim_names=("dp",), tp_size=2), "either mesh= .* or sizes"),
    (dict(dp_size=2, tp_size=2, mesh_dim_names=("dp",)), r"leave out \['tp'\]"),
])
def test_bad_rank_arrays_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeviceMesh(**kwargs)


@pytest.mark.parametrize("kwargs, message", [
    (dict(ulysses_size=2), "ulysses_size=2 is not supported"),
    (dict(dp_size=4, ep_size=2, ep_fsdp_size=4), "ep_fsdp_size=4, .* so it is 2"),
])
def test_upstream_only_sizes_are_refused_or_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeviceMesh.from_sizes(**kwargs)
    assert DeviceMesh.from_sizes(dp_size=4, ep_size=2, ep_fsdp_size=2, etp_size=1, ulysses_size=1).ep_size == 2


def test_dims_constant_is_the_storage_order():
    assert DIMS == ("pp", "dp", "fsdp", "cp", "tp")


def test_platform_reads_the_launchers_environment(monkeypatch):
    for name, value in {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
                        "GROUP_RANK": "1"}.items():
        monkeypatch.setenv(name, value)
    assert (Platform.get_rank(), Platform.get_world_size(), Platform.get_local_rank()) == (5, 8, 1)
    assert (Platform.get_local_world_size(), Platform.get_nnodes(), Platform.get_node_rank()) == (4, 2, 1)
    assert (Platform.is_master(), Platform.is_local_master(), Platform.is_last_rank()) == (False, False, False)
    assert Platform.device_prefix() == "cpu" and str(Platform.get_local_device()) == "cpu"
    monkeypatch.setenv("RANK", "five")
    with pytest.raises(ValueError, match=r"\$RANK='five' is not an integer"):
        Platform.get_rank()
