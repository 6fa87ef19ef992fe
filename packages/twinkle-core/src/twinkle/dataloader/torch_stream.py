"""The torch ``IterableDataset`` a stream's DataLoader workers iterate (imports torch: loaded only with workers).

A class at module level, so that ``spawn`` / ``forkserver`` workers can unpickle it by name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch.utils.data


class TorchStream(torch.utils.data.IterableDataset):
    """Hands torch's worker loop the chunks of a :class:`~twinkle.dataloader.stream.WorkerStream`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __iter__(self) -> Iterator[Any]:
        return iter(self.inner)
