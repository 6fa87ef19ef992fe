"""Hostile service inputs refused without a server: a JSON boolean where a number belongs, and a file planted
in a checkpoint directory as a hard link (another name for a file the server did not write)."""

from __future__ import annotations

import io
import os
import tarfile

import pytest


def test_a_boolean_ttl_is_refused_not_a_one_second_ttl() -> None:
    from tinker import types

    from twinkle_server.checks import refuse_bool_numbers
    from twinkle_server.errors import ApiError

    with pytest.raises(ApiError, match=r"ttl_seconds: true is not a number") as info:
        refuse_bool_numbers(types.SaveWeightsRequest, {"model_id": "m", "ttl_seconds": True})
    assert info.value.status == 400
    assert types.SaveWeightsRequest.model_validate({"model_id": "m", "ttl_seconds": True}).ttl_seconds == 1  # why
    refuse_bool_numbers(types.SaveWeightsRequest, {"model_id": "m", "ttl_seconds": 60, "overwrite": True})  # fine


def test_hard_links_in_a_checkpoint_are_never_served(tmp_path) -> None:
    from twinkle_server.downloads import listed_files, tar_stream

    secret = tmp_path / "secret.txt"  # a file the server can read, outside any checkpoint
    secret.write_text("not yours\n")
    checkpoint = tmp_path / "ckpt"
    (checkpoint / "sub").mkdir(parents=True)
    (checkpoint / "adapter_model.safetensors").write_bytes(b"weights")
    os.link(secret, checkpoint / "sub" / "planted.bin")
    os.symlink(secret, checkpoint / "link.bin")
    assert listed_files(checkpoint) == ["adapter_model.safetensors"]
    archive = tarfile.open(fileobj=io.BytesIO(b"".join(tar_stream(checkpoint, "ck"))))
    assert archive.getnames() == ["ck/adapter_model.safetensors"]


def test_a_request_refused_at_the_door_does_not_hold_up_the_next(tmp_path) -> None:
    from twinkle_server.futures import FutureTable, Result
    from twinkle_server.metrics import Metrics
    from twinkle_server.scheduler import Scheduler, Work
    from twinkle_server.store import Store

    store = Store(tmp_path / "registry.sqlite")
    table = FutureTable(store)
    scheduler = Scheduler(table, Metrics(), lambda batch: {}, batching=False)  # not started: only its queue
    scheduler.expect("m1", 1)
    second = Work(table.create("alice", "m1", "optim_step"), "optim_step", "m1", 2, run=lambda: Result({}))
    scheduler.submit(second)
    now = second.enqueued  # the moment it arrived: long before the reorder wait would let it go
    assert scheduler._ready(now) == []  # seq 1 may still come: seq 2 waits for it
    scheduler.refused("m1", 1)  # seq 1 got a 400 and was never queued
    assert [work for _, work in scheduler._ready(now)] == [second]  # runs at once
    scheduler.refused("m1", 4)  # a refusal further ahead is remembered until the order reaches it
    assert scheduler._take() == [second]  # the worker's step: take it (ready, so no wait) and finish it
    scheduler._finish_take([second])
    third = Work(table.create("alice", "m1", "optim_step"), "optim_step", "m1", 5, run=lambda: Result({}))
    scheduler.submit(third)
    assert scheduler._ready(third.enqueued) == []  # seq 3 has not come yet
    scheduler.refused("m1", 3)
    assert [work for _, work in scheduler._ready(third.enqueued)] == [third]  # 3 and 4 refused: 5 is next
    store.close()


def _get(url: str, path: str) -> bytes:
    """The raw answer to ``GET path`` (httpx refuses URLs over 64 KiB itself, so a socket sends it)."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit(url)
    with socket.create_connection((where.hostname, where.port), timeout=60) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {where.hostname}\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


def test_a_200_kb_download_token_gets_an_answer_not_a_reset(server) -> None:
    # h11's default 16 KiB head limit closed this connection while the client was still sending: a reset
    answer = _get(server.url, "/api/v1/downloads/" + "a" * 200_000)
    assert answer.startswith(b"HTTP/1.1 414 ") and b"not one this server made" in answer
    assert _get(server.url, "/api/v1/downloads/" + "a" * 100).startswith(b"HTTP/1.1 403 ")  # not signed: refused
