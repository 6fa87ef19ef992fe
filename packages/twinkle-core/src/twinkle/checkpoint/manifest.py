"""``manifest.json``: every file of a checkpoint with its size and a fast checksum (xxh3-64).

It is written last, inside the temporary directory, so a checkpoint under its final name always
has one. :func:`verify_manifest` finds a missing, truncated or bit-flipped file (same size, other
bytes) before anything is loaded. The checksum guards against damage, not against an attacker who
can rewrite the manifest too: what protects against crafted files is that twinkle never executes
code from a checkpoint (safetensors, ``weights_only=True``, ``twinkle.checkpoint.dcp_safe``).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
from collections.abc import Iterator
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


#: Checksums the ranks of a job computed for the manifest about to be written (see :func:`shared_checksums`).
_KNOWN: contextvars.ContextVar[dict[str, tuple[int, int, str]] | None] = contextvars.ContextVar("known", default=None)


def _stamp(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


def shared_checksums(directory: str | os.PathLike[str], share: tuple[int, int]) -> dict[str, tuple[int, int, str]]:
    """This rank's share of the checksums of ``directory``'s files: every n-th file from the i-th.

    Returns ``{name: (size, mtime_ns, checksum)}``; the ranks' tables, merged, are handed to
    :func:`write_manifest` through :func:`known_checksums`, so rank 0 no longer reads every byte of a sharded
    save alone while the others wait (the stamps make it re-read a file that changed since).
    """
    directory = Path(directory)
    names = sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST_FILE)
    return {str(p.relative_to(directory)): (*_stamp(p), file_checksum(p))
            for index, p in enumerate(names) if index % share[1] == share[0]}


@contextlib.contextmanager
def known_checksums(table: dict[str, tuple[int, int, str]]) -> Iterator[None]:
    """:func:`write_manifest` inside this block takes ``table``'s checksums for files whose stamps still match."""
    token = _KNOWN.set(table)
    try:
        yield
    finally:
        _KNOWN.reset(token)


def _checksum(directory: Path, path: Path) -> str:
    known = (_KNOWN.get() or {}).get(str(path.relative_to(directory)))
    if known is not None and known[:2] == _stamp(path):
        return known[2]
    return file_checksum(path)


def write_manifest(directory: str | os.PathLike[str], **fields: Any) -> Path:
    """Record every file under ``directory`` (size and checksum) plus ``fields``; returns the manifest path."""
    directory = Path(directory)
    path = directory / MANIFEST_FILE  # a sub-directory's own manifest (a model's inside a Trainer's) is listed
    files = {str(p.relative_to(directory)): {"size": p.stat().st_size, CHECKSUM: _checksum(directory, p)}
             for p in sorted(directory.rglob("*")) if p.is_file() and p != path}
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(json.dumps({**fields, "files": files}, indent=2) + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return path


def verify_manifest(directory: str | os.PathLike[str], checksums: bool = True,
                    share: tuple[int, int] = (0, 1)) -> dict[str, Any]:
    """The manifest of ``directory`` after checking it and every file; CheckpointError naming the first bad one.

    The manifest must be *contained* (every path it lists is inside ``directory``) and *complete* (every file
    of ``directory`` is listed: an unlisted weight or state file would be loaded without any check), and each
    listed file must have its size and, unless ``checksums=False`` (cheap: rotation), its checksum.
    ``share=(i, n)`` reads the bytes of every n-th file from the i-th only (the n ranks of a job split the
    checksum pass and agree afterwards); presence and sizes are checked for every file.

    Args:
        directory: the checkpoint directory.
        checksums: re-read every byte against the recorded xxh3 digests.
        share: ``(this rank, ranks)`` splitting the checksum reads.

    Returns:
        The manifest's contents.
    """
    directory = Path(directory)
    where = str(directory)
    try:
        manifest = json.loads((directory / MANIFEST_FILE).read_text(encoding="utf-8"))
        files = manifest["files"]
        if not isinstance(files, dict):
            raise TypeError(f"'files' is {type(files).__name__}, not a table")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{where!r} has no readable {MANIFEST_FILE} ({type(exc).__name__}: {exc}); "
                              "it is not a complete twinkle checkpoint.") from exc
    if not files:
        raise CheckpointError(f"{where!r}: {MANIFEST_FILE} lists no files, so it proves nothing about the "
                              "checkpoint; it was edited or written by another program (resume from another one).")
    entries = [(name, *_entry(where, name, entry), _contained(directory, name)) for name, entry in files.items()]
    unlisted = sorted(set(_present(directory)) - set(files))
    if unlisted:
        raise CheckpointError(f"{where!r} holds {', '.join(unlisted[:5])}{' ...' if len(unlisted) > 5 else ''}, "
                              f"which {MANIFEST_FILE} does not list: an unlisted file would be loaded unchecked. Move "
                              "it out of the checkpoint (or resume from another one).")
    for index, (name, size, expected, target) in enumerate(entries):
        if not target.is_file():
            raise CheckpointError(f"{where!r} is missing {name}.")
        actual = target.stat().st_size
        if actual != size:
            raise CheckpointError(f"{where!r}: {name} is {actual} bytes, the manifest says {size}.")
        mine = index % share[1] == share[0]
        if checksums and mine and expected is not None and file_checksum(target) != expected:
            raise CheckpointError(f"{where!r}: {name} does not match its checksum in {MANIFEST_FILE} "
                                  f"({CHECKSUM}); its bytes changed after it was saved (disk or copy damage).")
    return manifest


def _entry(where: str, name: str, entry: Any) -> tuple[int, str | None]:
    """``(size, checksum or None)`` of a manifest entry: a size, or ``{"size": int, "xxh3_64": hex}``."""
    size, expected = (entry, None) if isinstance(entry, int) else (
        (entry.get("size"), entry.get(CHECKSUM)) if isinstance(entry, dict) else (None, None))
    if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(expected, (str, type(None))):
        raise CheckpointError(f"{where!r}: {MANIFEST_FILE}'s entry for {name[:200]!r} is {str(entry)[:80]!r}, not "
                              f'{{"size": BYTES, "{CHECKSUM}": HEX}}; the manifest was edited or written by another '
                              "program (resume from another checkpoint).")
    return size, expected


def _contained(directory: Path, name: str) -> Path:
    """``directory/name`` when that is inside ``directory`` (no absolute path, ``..`` or link out of it)."""
    target = directory / name
    root = directory.resolve()
    if os.path.isabs(name) or root not in (target.resolve(), *target.resolve().parents) or target.resolve() == root:
        raise CheckpointError(f"{str(directory)!r}: {MANIFEST_FILE} lists {name[:200]!r}, which is not a file inside "
                              "the checkpoint; a manifest only vouches for the checkpoint's own files (it was edited: "
                              "resume from another checkpoint).")
    return target


def _present(directory: Path) -> list[str]:
    """Every file (or link) under ``directory`` but the manifest itself, as the manifest names it."""
    return [str(p.relative_to(directory)) for p in directory.rglob("*")
            if (p.is_file() or p.is_symlink()) and p != directory / MANIFEST_FILE]
