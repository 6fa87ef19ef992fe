"""``patch_for_dcp_finish``: DCP saves end without broadcasting the global metadata.

torch.distributed.checkpoint's save ends with a "write" step: every rank writes its shards, rank 0 gathers
the write results, writes the ``.metadata`` file and then broadcasts that global ``Metadata`` (every tensor's
every chunk: large for a big model on many ranks) to all ranks as ``dcp.save``'s return value. xtuner's
``patch_for_dcp_finish`` replaces torch 2.7's ``_save_state_dict`` with a copy whose finish step returns an
empty ``Metadata`` (and, on 2.7 only, adds plan caching, which torch >= 2.8 ships as
``DefaultSavePlanner(enable_plan_caching=True)``). twinkle does the finish part on any torch version without
copying torch code: while the patch is on, the reduce function of DCP's "write" step still runs (the
metadata file is written as before) but an empty ``Metadata`` is what is broadcast and returned. Nothing in
twinkle reads ``dcp.save``'s return value.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_users = 0
_original: Any = None


def _all_reduce(self: Any, step: str, map_fun: Any, reduce_fun: Any) -> Any:
    if step != "write":
        return _original(self, step, map_fun, reduce_fun)
    from torch.distributed.checkpoint.metadata import Metadata

    def finish_without_result(all_results: Any) -> Any:
        reduce_fun(all_results)  # storage_writer.finish: the .metadata file
        return Metadata(state_dict_metadata={})

    return _original(self, step, map_fun, finish_without_result)


@contextlib.contextmanager
def dcp_finish_patch(on: bool) -> Iterator[None]:
    """While the block runs (and ``on``), DCP saves broadcast an empty result from their finish step."""
    global _users, _original
    if not on:
        yield
        return
    from torch.distributed.checkpoint.utils import _DistWrapper

    with _lock:
        if _users == 0:
            _original = _DistWrapper.all_reduce
            _DistWrapper.all_reduce = _all_reduce
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                _DistWrapper.all_reduce = _original
                _original = None
