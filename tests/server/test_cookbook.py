"""tinker-cookbook recipes and the `tinker` CLI against `twinkle serve` started with default options.

One after another -- sl_loop, rl_loop, sl_basic (supervised/train.py), math_rl on arithmetic, the cookbook's
weights.download and `tinker checkpoint download` -- more runs than the default 4 LoRA slots
(server.max_tenants): none of the recipes finishes its
session at exit, so their models stay until the session timeout (600 s) and the server must page
idle ones out. The recipes run in the cookbook's own environment (``.venv-cookbook``, made by
``scripts/ensure_cookbook_env.py``, which ``./dev test`` runs before pytest) with local data and a
local tokenizer as the only adaptations (``cookbook_run.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from server_proc import BASE_MODEL, MODEL_ID, start_server

ROOT = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("cookbook_run.py")


@pytest.fixture(scope="module")
def cookbook_python() -> str:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "ensure_cookbook_env.py")], capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def default_server(server, tmp_path_factory):
    """`twinkle serve` with default options (only where it listens, its work dir and its keys file are given)."""
    running = start_server(tmp_path_factory.mktemp("default-server"), server.keys_file, server.keys, [])
    yield running
    running.stop()


def _run(python: str, server, args: list[str], cwd: Path) -> str:
    from twinkle.hub import resolve_path

    env = {**os.environ, "TINKER_BASE_URL": server.url, "TINKER_API_KEY": server.keys["alice"],
           "TWINKLE_MODEL_NAME": BASE_MODEL, "TWINKLE_TOKENIZER": resolve_path(MODEL_ID), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": ""}
    started = time.monotonic()
    done = subprocess.run([python, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    print(f"{' '.join(args[:2])}: {time.monotonic() - started:.0f}s")
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(1800)  # seven client processes that each import torch + transformers: minutes on a busy machine
def test_cookbook_recipes_and_the_cli_run_on_a_default_server(cookbook_python, default_server, tmp_path):
    started = time.monotonic()
    common = [f"model_name={BASE_MODEL}", "lora_rank=8"]
    sl = f"log_path={tmp_path / 'sl'}"
    runs = [
        ["-m", "tinker_cookbook.recipes.sl_loop", *common, sl, "batch_size=4", "max_steps=2", "save_every=1",
         "max_length=256", "learning_rate=1e-3"],
        ["-m", "tinker_cookbook.recipes.rl_loop", *common, f"log_path={tmp_path / 'rl'}", "batch_size=2",
         "group_size=2", "max_tokens=8", "max_steps=1", "save_every=0"],
        ["-m", "tinker_cookbook.recipes.sl_basic", *common, f"log_path={tmp_path / 'sl-basic'}", "eval_every=0"],
        ["-m", "tinker_cookbook.recipes.math_rl.train", *common, "renderer_name=role_colon", "env=arithmetic",
         "group_size=2", "groups_per_batch=2", "max_tokens=5", "max_steps=1", "eval_every=0", "save_every=0",
         f"log_path={tmp_path / 'math-rl'}"],
    ]
    for args in runs:
        _run(cookbook_python, default_server, [str(RUNNER), *args[1:]] if args[0] == "-m" else args, tmp_path)
    records = [json.loads(line) for line in (tmp_path / "sl" / "checkpoints.jsonl").read_text().splitlines()]
    final = next(r for r in records if r.get("name") == "final")

    # weights out: the cookbook's weights.download (age-encrypted export, decrypted locally) and the tinker CLI
    _run(cookbook_python, default_server, [str(RUNNER), "weights.download", final["state_path"],
                                           str(tmp_path / "dl-cookbook")], tmp_path)
    _run(cookbook_python, default_server, ["-m", "tinker.cli", "checkpoint", "download", final["state_path"],
                                           "--output", str(tmp_path / "dl-cli")], tmp_path)
    for directory in (tmp_path / "dl-cookbook", next((tmp_path / "dl-cli").iterdir())):
        names = {p.name for p in directory.iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors"} <= names, names

    elapsed = time.monotonic() - started
    runs = default_server.rest_client("alice").list_training_runs(limit=100).result().training_runs
    metrics = default_server.http("alice").get("/metrics").text
    paged_out = next(float(line.split()[1]) for line in metrics.splitlines()
                     if line.startswith('twinkle_pages_total{direction="out"}'))
    print(f"{len(runs)} training runs on 4 slots in {elapsed:.0f}s; {paged_out:.0f} page-outs")
    assert len(runs) >= 6 and paged_out > 0
