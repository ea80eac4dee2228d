"""Thread-bound, tamper-evident paging cursors (I/O-free).

A cursor is ``base64url(header | position | mac)``:

* ``header`` -- format version (1 byte), kind (1 byte: ledger or list) and an
  8-byte scope digest, ``sha256(tenant NUL user NUL thread_id)[:8]`` (the
  thread id is empty for ``list`` cursors);
* ``position`` -- the last row served (a stream id, or an index member);
* ``mac`` -- ``HMAC-SHA256(secret, header | position)[:16]``.

Decoding checks, in order: the size cap (``limit_exceeded``), the encoding and
the MAC (``invalid_cursor``: anything tampered, truncated or minted with
another secret), the kind (``invalid_cursor``), then the scope: a genuine
cursor minted for another thread is ``cursor_thread_mismatch``.  A MAC rather
than a bare checksum, so a client cannot forge a position either.  The binary
layout keeps the longest cursor (a list cursor naming a 128-byte thread id)
under 256 bytes, the smallest ``cursor_bytes`` configuration allows.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from enum import IntEnum
from typing import Final

from memtier.errors import ConversationError, ErrorCode

__all__ = ["CursorCodec", "CursorKind"]

_VERSION: Final = 1
_SCOPE_BYTES: Final = 8
_MAC_BYTES: Final = 16
_HEADER_BYTES: Final = 2 + _SCOPE_BYTES
_MAX_POSITION_BYTES: Final = 160  # "<20 digits>|<128-byte id>" = 149; a stream id is <= 41


class CursorKind(IntEnum):
    LEDGER = 1  # replay and export: a position in one thread's event stream
    LIST = 2  # list: a position in one owner's thread index


def _scope(tenant: str, user: str, thread_id: str) -> bytes:
    material = "\x00".join((tenant, user, thread_id)).encode("utf-8")
    return hashlib.sha256(material).digest()[:_SCOPE_BYTES]


class CursorCodec:
    """Mints and checks cursors with one secret (shared by every process of a namespace)."""

    def __init__(self, secret: bytes, *, max_bytes: int) -> None:
        if len(secret) < 16:
            raise ValueError("cursor secret must be at least 16 bytes")
        self._secret = secret
        self.max_bytes = max_bytes

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._secret, body, hashlib.sha256).digest()[:_MAC_BYTES]

    def encode(
        self, kind: CursorKind, position: str, *, tenant: str, user: str, thread_id: str = ""
    ) -> str:
        raw_position = position.encode("utf-8")
        if len(raw_position) > _MAX_POSITION_BYTES:
            raise ValueError("cursor position too long")
        body = bytes((_VERSION, int(kind))) + _scope(tenant, user, thread_id) + raw_position
        return base64.urlsafe_b64encode(body + self._mac(body)).rstrip(b"=").decode("ascii")

    def decode(
        self, cursor: str, kind: CursorKind, *, tenant: str, user: str, thread_id: str = ""
    ) -> str:
        """The position inside ``cursor``; raises ConversationError as described above."""
        if len(cursor.encode("utf-8")) > self.max_bytes:
            raise ConversationError(
                ErrorCode.LIMIT_EXCEEDED,
                f"cursor longer than {self.max_bytes} bytes",
                limit=self.max_bytes,
            )
        invalid = ConversationError(ErrorCode.INVALID_CURSOR, "invalid cursor")
        try:
            padded = cursor + "=" * (-len(cursor) % 4)
            raw = base64.urlsafe_b64decode(padded.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            raise invalid from None
        if len(raw) < _HEADER_BYTES + _MAC_BYTES + 1:
            raise invalid
        body, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(body)):
            raise invalid
        if body[0] != _VERSION or body[1] != int(kind):
            raise invalid
        if not hmac.compare_digest(body[2:_HEADER_BYTES], _scope(tenant, user, thread_id)):
            raise ConversationError(
                ErrorCode.CURSOR_THREAD_MISMATCH,
                "cursor was minted for another thread",
            )
        try:
            return body[_HEADER_BYTES:].decode("utf-8")
        except UnicodeDecodeError:
            raise invalid from None
