"""Weights out of the server: `tinker checkpoint download` gives a PEFT adapter that plain peft loads with the
same logits; signed URLs serve only the caller's own checkpoints; a whole checkpoint comes as a streamed tar."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile

import httpx
import numpy as np
import pytest
import tinker
import torch
from rounding import tiny_qwen, within
from server_proc import BASE_MODEL, MODEL_ID
from server_testing import sft_datums, train_steps
from tinker import types

ADAM = types.AdamParams(learning_rate=2e-2, eps=1e-8)


def _client_env(server, owner: str) -> dict[str, str]:
    return {**os.environ, "TINKER_BASE_URL": server.url, "TINKER_API_KEY": server.keys[owner]}


def test_tinker_checkpoint_download_gives_an_adapter_plain_peft_loads_with_the_same_logits(server, alice, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from twinkle.hub import resolve_path

    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=31).result()
    datums = sft_datums(training.get_tokenizer())
    train_steps(training, datums, 2, ADAM)
    path = training.save_state("to-download").result().path

    done = subprocess.run([sys.executable, "-m", "tinker.cli", "--format", "json", "checkpoint", "download", path,
                           "--output", str(tmp_path)], env=_client_env(server, "alice"), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    adapter = tmp_path / path.replace("tinker://", "").replace("/", "_")
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in adapter.iterdir()}
    assert not (adapter / "optimizer.pt").exists()  # the export holds the adapter (and tokenizer) only

    base = AutoModelForCausalLM.from_pretrained(resolve_path(MODEL_ID), torch_dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(base, str(adapter)).eval()
    served = training.forward(datums, "cross_entropy").result()
    for datum, output in zip(datums, served.loss_fn_outputs):
        ids = torch.tensor([datum.model_input.to_ints()])
        targets = torch.tensor(datum.loss_fn_inputs["target_tokens"].to_numpy()).long()
        with torch.no_grad():
            logprobs = torch.log_softmax(peft_model(input_ids=ids).logits[0].float(), dim=-1)
        local = logprobs.gather(-1, targets[:, None])[:, 0].numpy()
        # plain peft against the service: the same forward in another summation order (tests/rounding.py)
        np.testing.assert_allclose(local, np.asarray(output["logprobs"].data),
                                   **within(tiny_qwen(seq=20, rows=4).forward_bound(), torch.as_tensor(local)))

    # the CLI's temporary export was deleted afterwards; the caller's checkpoint is still there
    listed = [c.tinker_path for c in server.rest_client("alice").list_user_checkpoints(limit=1000).result().checkpoints]
    assert path in listed and not any("external_weights" in p for p in listed)


def test_download_urls_serve_only_the_callers_own_checkpoints(server, alice):
    training = alice.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=2).result()
    export = training.save_weights_external("export", ttl_seconds=3600).result().path
    sampler_path = training.save_weights_for_sampler("for-tar").result().path
    urls = server.rest_client("alice").get_external_weights_urls(export).result()
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(urls.urls)
    with httpx.Client(timeout=60) as plain:  # no key: the signed URL is the credential
        config = plain.get(urls.urls["adapter_config.json"])
        assert config.status_code == 200 and config.json()["r"] == 4
        forged = urls.urls["adapter_config.json"][:-4] + "0000"
        assert "not valid" in plain.get(forged).json()["detail"]

    with pytest.raises(tinker.NotFoundError):  # another key: the same 404 as a missing checkpoint
        server.rest_client("bob").get_external_weights_urls(export).result()
    model_id, checkpoint_id = sampler_path[len("tinker://"):].split("/", 1)
    with server.http("bob") as http:
        assert http.get(f"/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id}/archive").status_code == 404

    with server.http("alice") as http:  # a sampler checkpoint as a tar (what older clients' archive URL gives)
        answer = http.get(f"/api/v1/training_runs/{model_id}/checkpoints/{checkpoint_id}/archive")
        assert answer.status_code == 302
        tar_bytes = httpx.get(answer.headers["location"], timeout=60).content
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        names = tar.getnames()
    assert "for-tar/adapter_model.safetensors" in names and "for-tar/adapter_config.json" in names

    server.rest_client("alice").delete_checkpoint_from_tinker_path(export).result()
    with httpx.Client(timeout=60) as plain:  # a deleted checkpoint stops downloading at once
        assert plain.get(urls.urls["adapter_config.json"]).status_code == 404
