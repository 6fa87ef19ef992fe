"""``manifest.json``: every file of a checkpoint with its size and a fast checksum (xxh3-64).

It is written last, inside the temporary directory, so a checkpoint under its final name always
has one. :func:`verify_manifest` finds a missing, truncated or bit-flipped file (same size, other
bytes) before anything is loaded. The checksum guards against damage, not against an attacker who
can rewrite the manifest too: what protects against crafted files is that twinkle never executes
code from a checkpoint (safetensors, ``weights_only=True``, ``twinkle.checkpoint.dcp_safe``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from twinkle.checkpoint.errors import CheckpointError

MANIFEST_FILE = "manifest.json"
CHECKSUM = "xxh3_64"
_CHUNK = 8 << 20


def file_checksum(path: str | os.PathLike[str]) -> str:
    """The xxh3-64 digest of a file's bytes, as hex (read in 8 MiB chunks)."""
    import xxhash

    digest = xxhash.xxh3_64()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: str | os.PathLike[str], **fields: Any) -> Path:
    """Record every file under ``directory`` (size and checksum) plus ``fields``; returns the manifest path."""
    directory = Path(directory)
    path = directory / MANIFEST_FILE  # a sub-directory's own manifest (a model's inside a Trainer's) is listed
    files = {str(p.relative_to(directory)): {"size": p.stat().st_size, CHECKSUM: file_checksum(p)}
             for p in sorted(directory.rglob("*")) if p.is_file() and p != path}
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(json.dumps({**fields, "files": files}, indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return path


def verify_manifest(directory: str | os.PathLike[str], checksums: bool = True,
                    share: tuple[int, int] = (0, 1)) -> dict[str, Any]:
    """The manifest of ``directory`` after checking every file it lists; CheckpointError naming the first bad one.

    ``checksums=False`` checks presence and sizes only (cheap: used when rotating old checkpoints).
    ``share=(i, n)`` reads the bytes of every n-th file from the i-th only (the n ranks of a job split the
    checksum pass and agree afterwards); presence and sizes are checked for every file.
    """
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST_FILE).read_text(encoding="utf-8"))
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError(f"'files' is {type(files).__name__}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{str(directory)!r} has no readable {MANIFEST_FILE} ({type(exc).__name__}: {exc}); "
                              "it is not a complete twinkle checkpoint.") from exc
    for index, (name, entry) in enumerate(files.items()):
        target = directory / name
        size, expected = (entry, None) if isinstance(entry, int) else (entry.get("size"), entry.get(CHECKSUM))
        if not target.is_file():
            raise CheckpointError(f"{str(directory)!r} is missing {name}.")
        actual = target.stat().st_size
        if actual != size:
            raise CheckpointError(f"{str(directory)!r}: {name} is {actual} bytes, the manifest says {size}.")
        mine = index % share[1] == share[0]
        if checksums and mine and expected is not None and file_checksum(target) != expected:
            raise CheckpointError(f"{str(directory)!r}: {name} does not match its checksum in {MANIFEST_FILE} "
                                  f"({CHECKSUM}); its bytes changed after it was saved (disk or copy damage).")
    return manifest
