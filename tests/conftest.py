"""Suite-wide: the order of the files, the background launches several packages share, and ``rounding``
(the float32 rounding bounds parity tests derive their tolerances from) importable from every test module.

Ordering: the files marked ``slow`` (they launch processes: torchrun, Ray, a server) run first.

``./dev test`` hands whole files to two pytest-xdist workers in collection order; the long files at the
alphabetical end (tests/trainer) left one worker running them alone. Started first, the long files
overlap each other and the many short ones fill the gaps. The order within a file is unchanged.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # --import-mode=importlib: tests/rounding.py


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: files keep their order otherwise


@pytest.fixture(scope="session")
def start_background() -> Iterator[Callable[[list[str]], subprocess.Popen]]:
    """``start_background(args)`` runs a command in the background (stdout/stderr piped, text), in a session
    of its own; at the end of the test session whatever still runs is killed with its children, so an
    unused torchrun launch leaves no rank behind."""
    started: list[subprocess.Popen] = []

    def start(args: list[str]) -> subprocess.Popen:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
