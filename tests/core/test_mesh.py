"""DeviceMesh arithmetic checked against a brute-force enumeration, and its errors."""

from __future__ import annotations

import itertools

import pytest

from twinkle import DeviceGroup, DeviceMesh

ORDER = ("pp", "dp", "fsdp", "cp", "tp")


def brute_force(mesh: DeviceMesh) -> list[dict[str, int]]:
    """Rank r is the r-th point of the row-major product over (pp, dp, fsdp, cp, tp)."""
    ranges = [range(getattr(mesh, f"{d}_size")) for d in ORDER]
    return [dict(zip(ORDER, point)) for point in itertools.product(*ranges)]


@pytest.mark.parametrize(
    "sizes",
    [dict(dp_size=2, fsdp_size=2), dict(dp_size=2, tp_size=2, pp_size=2),
     dict(fsdp_size=2, cp_size=2, tp_size=2), dict(dp_size=3, tp_size=2), dict(dp_size=1)],
)
def test_coordinates_and_groups_match_enumeration(sizes):
    mesh = DeviceMesh.from_sizes(**sizes)
    expected = brute_force(mesh)
    assert mesh.world_size == len(expected)
    for rank, coords in enumerate(expected):
        got = mesh.coords(rank)
        assert {d: got[d] for d in ORDER} == coords
        assert mesh.rank_of(**coords) == rank
        assert mesh.data_rank_of(rank) == coords["dp"] * mesh.fsdp_size + coords["fsdp"]
        for dim in ORDER:
            peers = [r for r, c in enumerate(expected) if all(c[d] == coords[d] for d in ORDER if d != dim)]
            assert mesh.group_ranks(dim, rank) == peers
    # every data shard is read by world/data_world ranks, and there are dp*fsdp of them
    shards = [mesh.data_rank_of(r) for r in range(mesh.world_size)]
    assert sorted(set(shards)) == list(range(mesh.data_world_size))
    assert all(shards.count(s) == mesh.world_size // mesh.data_world_size for s in set(shards))


def test_multi_dim_group_and_expert_rank():
    mesh = DeviceMesh.from_sizes(dp_size=4, tp_size=2, ep_size=2)
    assert mesh.group_ranks(("dp", "tp"), 0) == list(range(8))
    assert [mesh.coords(r)["ep"] for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]


def test_dp_size_is_inferred_from_the_world(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    mesh = DeviceMesh.from_sizes(tp_size=2, fsdp_size=2)
    assert (mesh.dp_size, mesh.world_size) == (2, 8)
    monkeypatch.delenv("WORLD_SIZE")
    assert DeviceMesh.from_sizes().world_size == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(dp_size=0), "dp_size must be an integer >= 1, got 0"),
        (dict(tp_size=-2), "tp_size must be an integer >= 1, got -2"),
        (dict(fsdp_size=1.5), "fsdp_size must be an integer >= 1, got 1.5"),
        (dict(dp_size=2, tp_size=2, world_size=6), "= 4 processes, but the world size is 6"),
        (dict(tp_size=4, world_size=6), "world size 6 is not divisible by fsdp\\*tp\\*pp\\*cp=4"),
        (dict(dp_size=2, ep_size=3), "ep_size=3 must divide dp_size\\*fsdp_size\\*cp_size=2"),
        (dict(dp_size=2, sequence_parallel=True), "sequence_parallel=True needs tp_size > 1"),
    ],
)
def test_bad_sizes_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DeviceMesh.from_sizes(**kwargs)


def test_rank_and_dimension_errors():
    mesh = DeviceMesh.from_sizes(dp_size=2)
    with pytest.raises(ValueError, match="rank 2 is outside this mesh of 2 processes"):
        mesh.coords(2)
    with pytest.raises(KeyError, match="no dimension 'xp'"):
        mesh.size("xp")
    with pytest.raises(ValueError, match="dp coordinate 5 is outside 0..1"):
        mesh.rank_of(dp=5)


def test_device_group_validation():
    assert DeviceGroup("actor", 4).ranks == (0, 1, 2, 3)
    assert DeviceGroup("ref", [4, 5], device_mesh=DeviceMesh.from_sizes(dp_size=2)).world_size == 2
    with pytest.raises(ValueError, match="ranks must be distinct"):
        DeviceGroup("bad", [0, 0])
    with pytest.raises(ValueError, match="its mesh has 4 processes but the group has 2 ranks"):
        DeviceGroup("bad", 2, device_mesh=DeviceMesh.from_sizes(dp_size=4))
