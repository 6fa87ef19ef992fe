"""A real `twinkle serve` process on 127.0.0.1, driven by the real `tinker` client from PyPI.

One server is shared by the modules of this directory (``server`` fixture, session scope: starting
one costs ~15 s on two loaded cores); tests that kill or reconfigure a server start their own with
:func:`start_server`. Keys for two owners, ``alice`` and ``bob``, are made with the server's keygen.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ["TINKER_TELEMETRY"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from server_proc import SHARED_OPTIONS, Server, make_keys, start_server  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", "ignore:.*is_gradient_checkpointing.*:FutureWarning")
    config.addinivalue_line("filterwarnings", "ignore:.*load_state.*deprecated.*:FutureWarning")
    config.addinivalue_line("filterwarnings", "ignore:.*tie_word_embeddings.*:UserWarning")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Server:
    root = tmp_path_factory.mktemp("shared-server")
    keys_file = root / "keys.txt"
    running = start_server(root / "work", keys_file, make_keys(keys_file), SHARED_OPTIONS)
    yield running
    running.stop()


@pytest.fixture
def alice(server: Server) -> Any:
    """A ServiceClient of owner alice, closed (its session finished, its models unloaded) after the test."""
    client = server.service_client("alice")
    yield client
    client.close("success").result()


@pytest.fixture
def bob(server: Server) -> Any:
    client = server.service_client("bob")
    yield client
    client.close("success").result()
