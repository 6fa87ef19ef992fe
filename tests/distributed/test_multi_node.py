"""Beyond one machine, simulated on this one: two torchrun "nodes" and a Ray cluster of two raylets.

torchrun: two launches (``--nnodes 2 --nproc_per_node 2``, c10d rendezvous on 127.0.0.1) train HSDP, dp=2
replicating across the nodes and fsdp=2 sharding within each, and equal the one-node launch of the same world
size bit for bit. Why bitwise and not within a rounding bound: the layouts run the same float32 operations in
the same order. Each global rank gets the same rows (``rank::world``), the same seeded model and the same
shard; its forward and backward are local (one thread, OMP_NUM_THREADS=1); and the reduce-scatters and
all-reduces are gloo's over the same ranks in the same groups (c10d gives node i ranks 2i and 2i+1, as the
one-node launch's ranks are grouped), whose algorithm depends on the group, not on which launch started a
rank. Nothing in the run reads the node; a difference would be a real one (a wrong mesh or a lost shard).

Ray: ``ray start --head`` and ``ray start --address`` (one CPU each, loopback, their own temp dir) make two
nodes; the driver joins them, the two actors of a DDP group land one per node, and training equals the one
process within the derived bound of dist_bounds.py (as the one-node Ray run of test_ray_model.py does: the
actors sum in another order than one process).

Both clusters are stopped by killing their own launches' process groups, never with ``ray stop``: that stops
every Ray process of the machine, other tests' clusters included.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from dist_bounds import assert_trained_alike, run_bound
from launch import JobResult, free_port, torchrun, torchrun_nodes
from scenarios import global_batches, reference, tiny_config

pytestmark = pytest.mark.slow  # processes launched: started first (tests/conftest.py)

RAY = str(Path(sys.executable).with_name("ray"))


@pytest.fixture(scope="module")
def node_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[JobResult, JobResult]:
    """(two nodes x 2 processes, one node x 4 processes) of the same HSDP run."""
    two = torchrun_nodes("nodes_job.py", ["hsdp_nodes"], tmp_path_factory.mktemp("two_nodes"), nnodes=2, nproc=2)
    assert two.returncode == 0, f"two-node launch failed:\n{two.output[-6000:]}"
    one = torchrun("nodes_job.py", ["hsdp_nodes"], tmp_path_factory.mktemp("one_node"), nproc=4)
    assert one.returncode == 0, f"one-node launch failed:\n{one.output[-6000:]}"
    return two, one


def test_two_nodes_shard_within_and_replicate_across(node_runs) -> None:
    two, one = node_runs
    ranks = [two.load("hsdp_nodes", r) for r in range(4)]
    nodes = [got["node"] for got in ranks]
    assert nodes in ([0, 0, 1, 1], [1, 1, 0, 0])  # two ranks per launch, consecutive
    for rank, got in enumerate(ranks):
        assert got["layout"] == ((2, 2), ["R", "S(0)"])  # replicate x shard
        shard, replica = got["groups"]["fsdp"], got["groups"]["dp"]
        assert {ranks[r]["node"] for r in shard} == {got["node"]}  # shards stay on the node
        assert {ranks[r]["node"] for r in replica} == {0, 1}  # replicas span both nodes
        assert rank in shard and rank in replica
    assert [one.load("hsdp_nodes", r)["node"] for r in range(4)] == [0] * 4


def test_two_nodes_train_bitwise_like_one_node(node_runs) -> None:
    two, one = node_runs
    for rank in range(4):
        got, want = two.load("hsdp_nodes", rank), one.load("hsdp_nodes", rank)
        assert got["losses"] == want["losses"]
        assert got["metrics"] == want["metrics"]
        assert sorted(got["params"]) == sorted(want["params"])
        for key, value in want["params"].items():
            assert torch.equal(got["params"][key], value), key
            assert not torch.equal(value, want["initial"][key]), key  # trained: the comparison can fail


# ----------------------------------------------------------------------------- Ray: two raylets
def _ray_start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen:
    """``ray start ... --block``: the raylet's processes stay children of this launch, stopped with its group."""
    with log.open("w") as out:
        return subprocess.Popen([RAY, "start", "--block", "--disable-usage-stats", *args], stdout=out,
                                stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _wait_started(proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while "Ray runtime started" not in log.read_text():
        assert proc.poll() is None, f"ray start exited with {proc.returncode}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"ray start did not come up in {timeout}s:\n{log.read_text()[-4000:]}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def two_raylets():
    """A head and a second node, one CPU each, on loopback; yields the head's address."""
    temp = Path(tempfile.mkdtemp(prefix="tw-ray-", dir="/tmp"))  # short: Ray's socket paths must fit 107 bytes
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "TWINKLE_DEVICE": "cpu"}
    address = f"127.0.0.1:{free_port()}"
    common = ["--node-ip-address", "127.0.0.1", "--num-cpus", "1", "--temp-dir", str(temp)]
    launches = []
    try:
        launches.append(_ray_start(["--head", "--port", address.split(":")[1], "--include-dashboard", "false",
                                    *common], temp / "head.log", env))
        _wait_started(launches[0], temp / "head.log")
        launches.append(_ray_start(["--address", address, *common], temp / "worker.log", env))
        _wait_started(launches[1], temp / "worker.log")
        yield address
    finally:
        for proc in reversed(launches):  # the worker node first, while the head's GCS can still drain it
            # SIGTERM to ray start --block alone: it drains its node and stops that node's processes in order
            # (signalled all at once, the GCS dies first and the drain waits for it)
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # whatever of this launch is left
            except ProcessLookupError:
                pass
            proc.wait()
        shutil.rmtree(temp, ignore_errors=True)


def test_ray_two_nodes_train_like_one_process(two_raylets) -> None:
    import ray

    import twinkle
    from twinkle import DeviceGroup, DeviceMesh

    want = reference("ddp_full")  # before Ray mode makes every TransformersModel remote
    runtime = twinkle.initialize(mode="ray", ray_address=two_raylets,
                                 global_device_mesh=DeviceMesh.from_sizes(dp_size=2),
                                 groups=[DeviceGroup("actor", 2, device_type="cpu")], seed=0, timeout_s=180)
    try:
        assert len([node for node in ray.nodes() if node["Alive"]]) == 2
        from twinkle.model import TransformersModel

        model = TransformersModel(config=tiny_config("qwen2"), mixed_precision="no", remote_group="actor")
        model.set_optimizer("AdamW", lr=1e-2, eps=1.0)  # as the reference's (scripts/scenarios.py build())
        pg = runtime.cluster.placement_groups["actor"]
        placed = ray.util.placement_group_table(pg)["bundles_to_node_id"]
        assert len(set(placed.values())) == 2, placed  # one actor on each node
        losses, metrics = [], []
        for batch in global_batches():  # whole global batches: the proxy slices them by data rank
            losses.append(model.forward_backward(inputs=batch))
            model.clip_grad_and_step()
            metrics.append(model.calculate_metric(is_training=True))
        bound = run_bound(len(losses))  # dist_bounds.py: the actors sum in another order than one process
        assert [m["loss"] for m in metrics] == pytest.approx([m["loss"] for m in want["metrics"]], rel=bound, abs=0)
        state = model.get_state_dict()
        assert_trained_alike({"losses": losses, "params": {k: state[k] for k in want["params"]}}, want,
                             len(losses))
    finally:
        twinkle.shutdown()
        ray.shutdown()  # the driver joined a cluster it did not start: twinkle.shutdown leaves Ray connected
