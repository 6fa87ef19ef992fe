"""The `twinkle serve` process the server tests drive: start it, talk to it, kill and restart it.

Kept out of conftest.py so test modules import it by a unique name (every test directory has a
conftest module, and ``from server_proc import ...`` would find whichever was imported first).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

#: The served model (the default of `twinkle serve`) and the name clients use for it (no ':', see docs/server.md).
MODEL_ID = "twinkle://tiny-qwen"
BASE_MODEL = "twinkle/tiny-qwen"
#: The tiny model's LoRA layers per Tinker family (what a script would list for train_attn/mlp/unembed).
ALL_LAYERS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
#: Options of the shared server: small limits so the limit tests are cheap.
SHARED_OPTIONS = ["--server.max-tenants", "4", "--server.max-rank", "16", "--server.max-request-mb", "0.25",
                  "--server.max-length", "256", "--server.seed", "0", "--server.batch-window-ms", "500"]


@dataclass
class Server:
    """A running `twinkle serve` process and the keys to talk to it."""

    url: str
    work_dir: Path
    proc: subprocess.Popen
    log: Path
    keys: dict[str, str]
    keys_file: Path
    options: list[str] = field(default_factory=list)

    def service_client(self, owner: str = "alice") -> Any:
        import tinker

        return tinker.ServiceClient(base_url=self.url, api_key=self.keys[owner])

    def rest_client(self, owner: str = "alice") -> Any:
        import tinker

        return tinker.RestClient(base_url=self.url, api_key=self.keys[owner])

    def http(self, owner: str | None = "alice") -> httpx.Client:
        headers = {"X-API-Key": self.keys[owner]} if owner else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60)

    def checkpoint_dir(self, tinker_path: str) -> Path:
        model_id, kind, name = tinker_path[len("tinker://"):].split("/")
        return self.work_dir / "checkpoints" / model_id.replace(":", "~") / kind / name

    def alive(self) -> bool:
        return self.proc.poll() is None

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def restart(self) -> None:
        """Start again on the same work dir and port (clients keep their URL); the old process must be gone."""
        assert not self.alive()
        again = start_server(self.work_dir, self.keys_file, self.keys, [*self.options, "--server.port", str(self.port)])
        self.url, self.proc, self.log = again.url, again.proc, again.log

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


def make_keys(path: Path) -> dict[str, str]:
    from twinkle_server.auth import add_key

    return {owner: add_key(path, owner) for owner in ("alice", "bob")}


def start_server(work_dir: Path, keys_file: Path, keys: dict[str, str], options: list[str],
                 timeout: float = 240.0) -> Server:
    """Start `twinkle serve` (port 0) and wait until /api/v1/healthz answers."""
    work_dir.mkdir(parents=True, exist_ok=True)
    info = work_dir / "server.json"
    info.unlink(missing_ok=True)
    log = work_dir / f"server-{int(time.time() * 1000)}.log"
    command = [sys.executable, "-m", "twinkle.cli.main", "serve", "--server.port", "0", "--server.work-dir",
               str(work_dir), "--server.api-keys-file", str(keys_file), *options]
    handle = log.open("w")
    proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=dict(os.environ))
    handle.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"twinkle serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
        if info.is_file():
            url = json.loads(info.read_text())["url"]
            try:
                if httpx.get(f"{url}/api/v1/healthz", timeout=5).status_code == 200:
                    return Server(url, work_dir, proc, log, keys, keys_file, options)
            except httpx.HTTPError:
                pass
        time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"twinkle serve did not come up in {timeout}s:\n{log.read_text()[-4000:]}")
