"""Signed download URLs for the caller's own checkpoints: one file each, or the whole directory as a tar.

The ``tinker`` client (``tinker checkpoint download``, ``get_external_weights_urls``) and the
cookbook's ``weights.download`` fetch files with a plain GET, no API key: the URL itself is the
credential. A URL carries the checkpoint, the file (or ``*`` for the tar), its expiry and an
HMAC-SHA256 over them with a key kept in the work dir (``download.key``, made on first start, mode
600). It is checked, and the checkpoint looked up in the registry again, on every GET: a deleted or
expired checkpoint stops downloading at once. Paths inside the URL are never trusted for the file
system: the file must be one the checkpoint directory lists.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: How long a signed URL stays valid.
URL_TTL_S = 3600
#: The tar stream is produced in pieces of about this size.
_PIECE = 1 << 20


class DownloadError(ValueError):
    """A download URL that is malformed, forged or expired."""


class Signer:
    """Makes and checks the signed tokens of download URLs."""

    def __init__(self, work_dir: Path) -> None:
        path = work_dir / "download.key"
        if not path.is_file():
            fd = os.open(str(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                handle.write(secrets.token_bytes(32))
        self._key = path.read_bytes()

    def token(self, owner: str, tinker_path: str, file: str, expires: float) -> str:
        claims = json.dumps({"o": owner, "p": tinker_path, "f": file, "e": int(expires)}, separators=(",", ":"))
        body = base64.urlsafe_b64encode(claims.encode()).decode().rstrip("=")
        return f"{body}.{self._sign(body)}"

    def check(self, token: str) -> dict[str, Any]:
        """The claims of a valid, unexpired token; else :class:`DownloadError`."""
        body, _, signature = token.partition(".")
        if not body or not hmac.compare_digest(signature, self._sign(body)):
            raise DownloadError("this download link is not valid; ask for a new one (get_external_weights_urls).")
        claims = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        if claims["e"] < time.time():
            raise DownloadError("this download link has expired; ask for a new one (get_external_weights_urls).")
        return claims

    def _sign(self, body: str) -> str:
        return hmac.new(self._key, body.encode(), hashlib.sha256).hexdigest()


def listed_files(directory: Path) -> list[str]:
    """The regular files of a checkpoint directory, relative and sorted.

    Only the server's own files are served: never a symlink, and never a file with a second hard link (the
    server writes each checkpoint file once, so another name for its inode was planted, possibly to a file
    outside the work dir that the server can read).
    """
    out = []
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.lstat().st_nlink == 1:
            out.append(path.relative_to(directory).as_posix())
    return out


def tar_stream(directory: Path, name: str) -> Iterator[bytes]:
    """A tar of ``directory``'s files under ``name/``, produced piece by piece (never whole in memory)."""
    pipe = _Pipe()

    def write() -> None:
        try:
            with tarfile.open(fileobj=pipe, mode="w|") as tar:
                for rel in listed_files(directory):
                    tar.add(str(directory / rel), arcname=f"{name}/{rel}", recursive=False)
        except BaseException as exc:  # noqa: BLE001 - the reader re-raises it
            pipe.error = exc
        finally:
            pipe.close()

    threading.Thread(target=write, daemon=True, name="tar-stream").start()
    yield from pipe.pieces()


class _Pipe:
    """A file-like sink whose writes come out of :meth:`pieces` (bounded: the writer waits for the reader)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._chunks: list[bytes] = []
        self._size = 0
        self._closed = False
        self.error: BaseException | None = None

    def write(self, data: bytes) -> int:
        with self._cond:
            while self._size > 4 * _PIECE and not self._closed:
                self._cond.wait()
            self._chunks.append(bytes(data))
            self._size += len(data)
            self._cond.notify_all()
        return len(data)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def pieces(self) -> Iterator[bytes]:
        while True:
            with self._cond:
                while not self._chunks and not self._closed:
                    self._cond.wait()
                chunks, self._chunks, self._size = self._chunks, [], 0
                done = self._closed and not chunks
                self._cond.notify_all()
            if chunks:
                yield b"".join(chunks)
            if done:
                if self.error is not None:
                    raise self.error
                return
