"""A torchrun rank that never calls ``twinkle.initialize`` still picks its own device (issue 22, defect 3).

``ensure_process_group`` (MegatronModel) brings torch.distributed up without ``initialize``; the runtime
then was the default one with ``local_rank=0``, so every rank chose ``cuda:0``, and the process group was
created without ``device_id``. Here rank 1 of 2 (``LOCAL_RANK=1``) runs on a simulated 2-GPU CUDA
platform, with a spy in place of ``torch.distributed.init_process_group``.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import twinkle
import twinkle.runtime
from twinkle.platform import CPUPlatform, CUDAPlatform
from twinkle.runtime import Runtime


@pytest.fixture
def rank_one(monkeypatch):
    """LOCAL_RANK=1 of a 2-process torchrun launch, no twinkle.initialize yet, torch.distributed not up."""
    monkeypatch.setattr(twinkle.runtime, "_runtime", Runtime())
    for var, value in {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(var, value)
    monkeypatch.delenv("TWINKLE_DEVICE", raising=False)
    calls: list[dict] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: calls.append(kwargs))
    return calls


@pytest.fixture
def two_gpus(monkeypatch):
    """The CUDA platform as on a 2-GPU node; ``set_device`` calls are recorded."""
    bound: list[int] = []
    monkeypatch.setattr(CUDAPlatform, "is_available", classmethod(lambda cls: True))
    monkeypatch.setattr(CUDAPlatform, "device_count", classmethod(lambda cls: 2))
    monkeypatch.setattr(CUDAPlatform, "set_device", classmethod(lambda cls, local_rank: bound.append(local_rank)))
    return bound


def test_the_local_rank_comes_from_torchrun_until_initialize_runs(rank_one):
    assert twinkle.runtime.local_rank() == 1


def test_the_backends_select_the_device_of_their_local_rank(rank_one, two_gpus):
    from twinkle_hf.model.build import process_device as hf_device

    assert hf_device() == torch.device("cuda", 1)
    pytest.importorskip("megatron.core")
    from twinkle_megatron.model.build import process_device as megatron_device

    assert megatron_device() == torch.device("cuda", 1)


def test_megatron_binds_the_process_and_the_group_to_its_device(rank_one, two_gpus):
    pytest.importorskip("megatron.core")
    from twinkle_megatron.parallel.state import ensure_process_group

    ensure_process_group("cuda")
    assert two_gpus == [1]
    assert rank_one == [{"backend": "cpu:gloo,cuda:nccl", "rank": 1, "world_size": 2,
                         "device_id": torch.device("cuda", 1), "timeout": timedelta(seconds=1800)}]


def test_initialize_gives_the_group_its_device_too(rank_one, two_gpus):
    rt = twinkle.initialize()
    assert (rt.rank, rt.local_rank, rt.platform) == (1, 1, "cuda")
    assert two_gpus == [1]
    assert [call["device_id"] for call in rank_one] == [torch.device("cuda", 1)]


def test_on_the_cpu_the_group_gets_no_device(rank_one):
    pytest.importorskip("megatron.core")
    from twinkle_megatron.parallel.state import ensure_process_group

    ensure_process_group("cpu")
    assert rank_one == [{"backend": CPUPlatform.dist_backend, "rank": 1, "world_size": 2,
                         "timeout": timedelta(seconds=1800)}]


def test_a_rank_sees_the_device_set_binds_when_fewer_are_visible(two_gpus):
    """LOCAL_RANK 3 with 2 visible devices (a launcher that restricts CUDA_VISIBLE_DEVICES): cuda:1, as set_device."""
    assert CUDAPlatform.device(3) == torch.device("cuda", 1)
    assert CUDAPlatform.bind(3) == {"device_id": torch.device("cuda", 1)} and two_gpus == [3]


def test_the_process_group_timeout_is_sized_for_checkpoint_writes(rank_one):
    """Without ``timeout_s`` the group gets half an hour (torch's NCCL default, 10 minutes, is shorter than a
    large full-model save keeps the other ranks waiting); a given ``timeout_s`` is kept."""
    twinkle.initialize(device="cpu")
    twinkle.initialize(device="cpu", timeout_s=90)
    assert [c["timeout"] for c in rank_one] == [timedelta(seconds=1800), timedelta(seconds=90)]
