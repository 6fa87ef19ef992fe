"""API keys: only their SHA-256 hashes are stored; a request's key maps to the owner of everything it creates.

The keys file has one ``<owner> <sha256 hex of the key>`` per line (``#`` starts a comment).
``twinkle serve keygen OWNER --keys-file FILE`` makes a key, appends its hash and prints the key
once. Keys look like Tinker's (``tml-...``), which the client checks. The client sends the key as
``X-API-Key``; ``Authorization: Bearer <key>`` works too.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from pathlib import Path

from twinkle.config import ConfigError

KEY_PREFIX = "tml-"
_OWNER = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_HASH = re.compile(r"^[0-9a-f]{64}$")


def hash_key(key: str) -> str:
    """The stored form of an API key."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A fresh random API key in the client's format."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class KeyStore:
    """Owner lookup by API key over the hashes of a keys file."""

    def __init__(self, hashes: dict[str, str]) -> None:
        self._owners = {digest: owner for owner, digest in hashes.items()}

    @classmethod
    def from_file(cls, path: str | Path) -> KeyStore:
        path = Path(path).expanduser()
        if not path.is_file():
            raise ConfigError(f"server.api_keys_file {str(path)!r} does not exist; create a key with "
                              f"`twinkle serve keygen OWNER --keys-file {path}`.")
        hashes: dict[str, str] = {}
        for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            if len(parts) != 2 or not _OWNER.match(parts[0]) or not _HASH.match(parts[1]):
                raise ConfigError(f"{str(path)!r} line {number}: expected '<owner> <sha256 hex>' (as written by "
                                  "`twinkle serve keygen`), not a raw key.")
            if parts[0] in hashes:
                raise ConfigError(f"{str(path)!r} line {number}: owner {parts[0]!r} appears twice; one key per owner.")
            hashes[parts[0]] = parts[1]
        if not hashes:
            raise ConfigError(f"{str(path)!r} holds no keys; add one with `twinkle serve keygen OWNER --keys-file "
                              f"{path}`.")
        return cls(hashes)

    def owner(self, key: str | None) -> str | None:
        """The owner of ``key``, or None for a missing or unknown key (constant-time comparison)."""
        if not key:
            return None
        digest = hash_key(key)
        found = None
        for stored, owner in self._owners.items():
            if hmac.compare_digest(stored, digest):
                found = owner
        return found


def add_key(path: str | Path, owner: str) -> str:
    """Create a key for ``owner``, append its hash to the keys file and return the key (shown once)."""
    if not _OWNER.match(owner):
        raise ConfigError(f"owner {owner!r}: use 1-64 letters, digits, '_', '-' or '.'.")
    path = Path(path).expanduser()
    if path.is_file() and owner in KeyStore.from_file(path)._owners.values():
        raise ConfigError(f"owner {owner!r} already has a key in {str(path)!r}; remove its line to replace it.")
    key = new_key()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(f"{owner} {hash_key(key)}\n")
    path.chmod(0o600)
    return key


def key_from_headers(x_api_key: str | None, authorization: str | None) -> str | None:
    """The key a request carries: ``X-API-Key`` (what the tinker client sends) or a bearer token."""
    if x_api_key:
        return x_api_key.strip()
    if authorization and authorization.lower().startswith("bearer "):
        return authorization[7:].strip()
    return None
