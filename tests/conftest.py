"""Suite-wide ordering: the files marked ``slow`` (they launch processes: torchrun, Ray, a server) run first.

``./dev test`` hands whole files to two pytest-xdist workers in collection order; the long files at the
alphabetical end (tests/trainer) left one worker running them alone. Started first, the long files
overlap each other and the many short ones fill the gaps. The order within a file is unchanged.
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_files = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow_files)  # stable: files keep their order otherwise
