"""API keys of ``memtier serve``: Bearer tokens checked by SHA-256, no plaintext on disk.

The file is TOML, one ``[[keys]]`` table per client::

    [[keys]]
    sha256 = "<64 hex digits: sha256 of the token>"
    tenant = "acme"          # the Ownership every request with this token acts as
    user = "alice"
    name = "alice's laptop"  # optional, for people

A client sends ``Authorization: Bearer <token>``; the token is hashed and
compared with *every* entry using :func:`hmac.compare_digest` (no early exit,
so the time taken does not depend on which entry matched).  Fields that could
hold a plaintext secret (``token``, ``key``, ``secret``, ``password``) are
refused at load time, as are unknown fields and duplicate digests.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from starlette.requests import Request

from memtier.errors import ConfigurationError, ConversationError
from memtier.threads.models import Ownership

__all__ = ["ApiKey", "ApiKeys", "token_digest"]

_HEX64: Final = re.compile(r"^[0-9a-f]{64}\Z")
_ALLOWED: Final = frozenset({"sha256", "tenant", "user", "name"})
_PLAINTEXT: Final = frozenset({"token", "key", "secret", "password", "bearer", "api_key"})
MAX_KEYS: Final = 10_000  # entries per file: bounds the constant-time scan
MAX_TOKEN_BYTES: Final = 4096  # a longer Authorization header is refused unread


def token_digest(token: str) -> str:
    """The hex SHA-256 of a token: what the keys file stores."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class ApiKey:
    digest: bytes
    owner: Ownership
    name: str | None = None


class ApiKeys:
    """Loaded API keys; :meth:`authorize` is the ``authorize`` hook of the HTTP app."""

    def __init__(self, keys: list[ApiKey]) -> None:
        if not keys:
            raise ConfigurationError("the API-keys file has no [[keys]] entries")
        self.keys = tuple(keys)

    @classmethod
    def load(cls, path: str | Path) -> ApiKeys:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"cannot read API-keys file {path}: {exc}") from exc
        return cls.from_mapping(data, source=str(path))

    @classmethod
    def from_mapping(cls, data: dict[str, Any], *, source: str = "API keys") -> ApiKeys:
        if set(data) - {"keys"}:
            raise ConfigurationError(f"{source}: only [[keys]] tables are allowed")
        entries = data.get("keys", [])
        if not isinstance(entries, list):
            raise ConfigurationError(f"{source}: expected [[keys]] tables")
        if len(entries) > MAX_KEYS:
            raise ConfigurationError(f"{source}: more than {MAX_KEYS} keys")
        keys: list[ApiKey] = []
        seen: set[str] = set()
        for i, entry in enumerate(entries, 1):
            where = f"{source}: keys[{i}]"
            if not isinstance(entry, dict):
                raise ConfigurationError(f"{where}: not a table")
            plaintext = {k.lower() for k in entry} & _PLAINTEXT
            if plaintext:
                raise ConfigurationError(
                    f"{where}: field {sorted(plaintext)[0]!r} would hold a plaintext token;"
                    " store only sha256 = hex digest of the token"
                )
            unknown = set(entry) - _ALLOWED
            if unknown:
                raise ConfigurationError(f"{where}: unknown fields {sorted(unknown)}")
            digest = entry.get("sha256")
            if not isinstance(digest, str) or not _HEX64.match(digest.lower()):
                raise ConfigurationError(f"{where}: sha256 must be 64 hex digits")
            digest = digest.lower()
            if digest in seen:
                raise ConfigurationError(f"{where}: duplicate sha256")
            seen.add(digest)
            tenant, user = entry.get("tenant"), entry.get("user")
            if not isinstance(tenant, str) or not isinstance(user, str):
                raise ConfigurationError(f"{where}: tenant and user are required strings")
            try:
                owner = Ownership(tenant, user)
            except ConversationError as exc:
                raise ConfigurationError(f"{where}: {exc.message}") from None
            name = entry.get("name")
            if name is not None and not isinstance(name, str):
                raise ConfigurationError(f"{where}: name must be a string")
            keys.append(ApiKey(bytes.fromhex(digest), owner, name))
        return cls(keys)

    def owner_for(self, token: str) -> Ownership | None:
        """The ownership of ``token``, or None; compares against every key (constant work)."""
        presented = hashlib.sha256(token.encode("utf-8")).digest()
        found: Ownership | None = None
        for key in self.keys:
            if hmac.compare_digest(key.digest, presented):
                found = key.owner
        return found

    def authorize(self, request: Request) -> Ownership | None:
        header = request.headers.get("authorization", "")
        if not header or len(header) > MAX_TOKEN_BYTES:
            return None
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        return self.owner_for(token)
