"""Predicates on what a candidate value looks like, beyond what its regex can say.

A pattern match is only a candidate; these checks decide whether the matched word is
credential-shaped (long enough, has a digit) or decodes to the structure a real token has.
They keep prose ("Bearer instrument", "basic training") out of the placeholders.  Used by
the pattern table (:mod:`memtier.redaction.patterns`, as token validators) and by the
replacement rules (:mod:`memtier.redaction.detectors`, :mod:`memtier.redaction.assignments`).
"""

from __future__ import annotations

import base64
import binascii

__all__ = ["basic_credentials", "discord_bot_valid", "has_digit", "tokenish"]


def has_digit(value: str) -> bool:
    return any(c.isdigit() for c in value)


def tokenish(value: str, min_len: int = 8) -> bool:
    """A credential-looking word: long enough, and either containing a digit or very long.

    Keeps prose ("Bearer instrument", "Authorization: required") out of the placeholders.
    """
    return len(value) >= min_len and (has_digit(value) or len(value) >= 20)


def discord_bot_valid(token: str) -> bool:
    first = token.split(".", 1)[0]
    try:
        decoded = base64.b64decode(first + "=" * (-len(first) % 4), altchars=b"-_", validate=True)
    except binascii.Error:
        return False
    return decoded.isdigit()  # the first segment is the base64 of a numeric user id


def basic_credentials(value: str) -> bool:
    """True iff ``value`` is the base64 of printable ``user:password`` (HTTP Basic)."""
    try:
        decoded = base64.b64decode(value + "=" * (-len(value) % 4), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return False
    user, colon, _password = decoded.partition(":")
    return bool(colon and user and decoded.isprintable())  # not "basic training"
