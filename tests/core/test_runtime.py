"""initialize(), seeds, groups, placement, logging and the remote decorators."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import twinkle
from twinkle import DeviceGroup, DeviceMesh, remote_class, remote_function
from twinkle.actors.dispatch import RemoteFunctionSpec, remote_spec

SCRIPT = Path(__file__).parent / "scripts" / "runtime_world.py"


@pytest.fixture(autouse=True)
def single_process(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TWINKLE_DEVICE"):
        monkeypatch.delenv(var, raising=False)


def test_initialize_single_process_defaults():
    rt = twinkle.initialize(seed=7)
    assert (rt.mode, rt.rank, rt.world_size, rt.platform, rt.initialized) == ("local", 0, 1, "cpu", True)
    assert rt.device_mesh.world_size == 1 and rt.data_rank == 0
    assert twinkle.get_runtime() is rt and twinkle.get_device_mesh() is rt.device_mesh


def test_seed_makes_runs_repeatable():
    twinkle.initialize(seed=123)
    first = torch.rand(4)
    twinkle.initialize(seed=123)
    assert torch.equal(first, torch.rand(4))
    twinkle.initialize(seed=124)
    assert not torch.equal(first, torch.rand(4))


def test_initialize_rejects_bad_arguments():
    with pytest.raises(ValueError, match="mode must be one of local, ray"):
        twinkle.initialize(mode="slurm")
    with pytest.raises(ValueError, match="= 2 processes, but the world size is 1"):
        twinkle.initialize(global_device_mesh=DeviceMesh.from_sizes(dp_size=2))
    with pytest.raises(ValueError, match="uses rank 3 but only 1 processes were launched"):
        twinkle.initialize(groups=[DeviceGroup("actor", [3])])
    with pytest.raises(ValueError, match="Two device groups are named 'a'"):
        twinkle.initialize(groups=[DeviceGroup("a", 1), DeviceGroup("a", 1)])
    with pytest.raises(RuntimeError, match="Platform 'cuda' was requested .* not available"):
        twinkle.initialize(device="cuda")


def test_ray_mode_without_ray_names_the_extra(monkeypatch):
    before = twinkle.initialize(seed=3)
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(ImportError, match=r"pip install 'twinkle-core\[ray\]'"):
        twinkle.initialize(mode="ray")
    assert twinkle.get_runtime() is before


def test_placement_picture_names_every_rank():
    rt = twinkle.runtime.Runtime(device_mesh=DeviceMesh.from_sizes(dp_size=2, tp_size=2), world_size=4, rank=3,
                                 groups={"actor": DeviceGroup("actor", 4)})
    text = twinkle.get_device_placement(rt)
    lines = text.splitlines()
    assert "world_size=4" in lines[0] and "this_rank=3" in lines[0]
    header = lines[2].split()
    assert header == ["rank", "device", "pp", "dp", "fsdp", "cp", "tp", "ep", "data"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[3:7]}
    assert rows["*3"] == ["cpu", "0", "1", "0", "0", "1", "0", "1"]
    assert rows["0"] == ["cpu", "0", "0", "0", "0", "0", "0", "0"]
    assert "group 'actor': ranks [0, 1, 2, 3]" in text


def test_remote_class_is_transparent_locally_and_checks_groups():
    @remote_class()
    class Component:
        def __init__(self, width: int):
            self.width = width

        @remote_function(dispatch="slice_dp", collect="mean")
        def score(self, xs):
            return sum(xs) / len(xs) * self.width

    twinkle.initialize()
    c = Component(3, remote_group="actor")  # no groups declared: accepted and recorded
    assert (c.width, c.remote_group, c.score([1, 2, 3])) == (3, "actor", 6.0)
    assert remote_spec(Component.score) == RemoteFunctionSpec(dispatch="slice_dp", execute="all", collect="mean")
    twinkle.initialize(groups=[DeviceGroup("actor", 1)])
    assert Component(1, remote_group="actor").remote_group == "actor"
    with pytest.raises(KeyError, match="No device group named 'critic'; declared groups: actor"):
        Component(1, remote_group="critic")
    with pytest.raises(ValueError, match="collect='median' is not one of"):
        remote_function(collect="median")


def test_logger_is_rank_aware(monkeypatch, capsys):
    logger = twinkle.get_logger("tests.runtime")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    logger.info("info from rank 1")
    logger.warning("warning from rank 1")
    monkeypatch.setenv("RANK", "0")
    logger.info("info from rank 0")
    err = capsys.readouterr().err
    assert "info from rank 1" not in err
    assert "[rank 1] warning from rank 1" in err
    assert "[rank 0] info from rank 0" in err
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TWINKLE_LOG_ALL_RANKS", "1")
    logger.info("now rank 1 speaks")
    assert "now rank 1 speaks" in capsys.readouterr().err
    assert logger.name == "twinkle.tests.runtime" and logging.getLogger("twinkle").propagate is False


def test_torchrun_two_processes(tmp_path):
    """Two gloo ranks: same seed stream, one torch mesh, a real all-reduce, data ranks 0 and 1."""
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(SCRIPT), str(tmp_path)],
        capture_output=True, text=True, timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["rank"] for r in reports] == [0, 1]
    assert [r["data_rank"] for r in reports] == [0, 1]
    assert {r["backend"] for r in reports} == {"gloo"}
    assert all(r["all_reduce"] == 3.0 for r in reports)
    assert all(r["mesh_dims"] == ["dp"] and r["mesh_shape"] == [2] for r in reports)
    torch.manual_seed(1234)
    expected = torch.rand(1).item()
    assert all(r["first_random"] == expected for r in reports)
    assert "*1" in reports[1]["placement"] and "world_size=2" in reports[0]["placement"]
    # the current-rank answers come from the process group, and a rank array round-trips through torch's mesh
    assert [r["current_dp_rank"] for r in reports] == [0, 1]
    assert [r["reversed_dp_rank"] for r in reports] == [1, 0]
    assert [r["reversed_torch_coordinate"] for r in reports] == [[1], [0]]
    assert all(r["reversed_torch_ranks"] == [1, 0] and r["round_trip_equal"] for r in reports)


def test_exit_waits_for_threads_still_running():
    """What the process-group teardown waits for: no other thread of the process may still be running."""
    import threading
    import time

    from twinkle.runtime import wait_for_idle_threads

    stop = threading.Event()

    def spin(until: float) -> None:
        while time.monotonic() < until and not stop.is_set():
            pass

    worker = threading.Thread(target=spin, args=(time.monotonic() + 0.3,))
    worker.start()
    assert wait_for_idle_threads(timeout_s=10) and not worker.is_alive()
    stuck = threading.Thread(target=spin, args=(time.monotonic() + 60,))
    stuck.start()
    try:
        assert wait_for_idle_threads(timeout_s=0.3) is False
    finally:
        stop.set()
        stuck.join()
