"""Names clients understand: a hub model is served under its hub id (no ':'), its tokenizer_id is that id, and the
training and sampling clients' get_tokenizer() load it the way they do against Tinker (from the hub; here its
offline cache, laid out as huggingface_hub writes it)."""

from __future__ import annotations

import os
import shutil

import pytest
from server_proc import start_server

HUB_ID = "twinkle-test/tiny-qwen"


@pytest.fixture(scope="module")
def hub_server(server, tmp_path_factory):
    from twinkle.hub import resolve_path

    home = tmp_path_factory.mktemp("hf-home")
    snapshot = home / "hub" / f"models--{HUB_ID.replace('/', '--')}" / "snapshots" / ("0" * 40)
    shutil.copytree(resolve_path("twinkle://tiny-qwen"), snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    saved = {k: os.environ.get(k) for k in ("HF_HOME", "HF_HUB_OFFLINE")}
    os.environ.update(HF_HOME=str(home), HF_HUB_OFFLINE="1")  # the server process starts with this cache
    try:
        running = start_server(tmp_path_factory.mktemp("hub-server"), server.keys_file, server.keys,
                               ["--model.model-id", f"hf://{HUB_ID}", "--server.max-rank", "8"])
        running.hf_home = str(home)
        yield running
        running.stop()
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


#: The client side, in a fresh interpreter: huggingface_hub reads HF_HOME when it is imported.
CLIENT = """
import json, sys, tinker
url, key, hub_id = sys.argv[1:]
client = tinker.ServiceClient(base_url=url, api_key=key)
training = client.create_lora_training_client(base_model=hub_id, rank=4).result()
info = training.get_info()
ids = training.get_tokenizer().encode("I am twinkle")
sampler = training.save_weights_and_get_sampling_client().result()
print(json.dumps({"model_name": info.model_data.model_name, "tokenizer_id": info.model_data.tokenizer_id,
                  "training_ids": ids, "sampling_ids": sampler.get_tokenizer().encode("I am twinkle")}))
client.close("success").result()
"""


def test_a_hub_model_is_served_under_its_hub_id_and_clients_load_its_tokenizer(hub_server):
    import json
    import subprocess
    import sys

    capabilities = hub_server.rest_client("alice").get_server_capabilities().result()
    assert capabilities.supported_models[0].model_name == HUB_ID
    done = subprocess.run([sys.executable, "-c", CLIENT, hub_server.url, hub_server.keys["alice"], HUB_ID],
                          env={**os.environ, "HF_HOME": hub_server.hf_home, "HF_HUB_OFFLINE": "1"},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert (seen["model_name"], seen["tokenizer_id"]) == (HUB_ID, HUB_ID)  # a hub id, not a path on the server
    assert seen["training_ids"] == seen["sampling_ids"] and seen["training_ids"]  # SamplingClient: by base model name
