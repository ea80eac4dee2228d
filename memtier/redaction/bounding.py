"""Bounding: cut text to a UTF-8 byte budget without splitting a character or a grapheme.

Owns :func:`bound_utf8` (and :func:`encode_utf8`, which refuses lone surrogates with a
:class:`~memtier.errors.ValidationError`).  The cut never splits a code point, and, looking
back at most :data:`_MAX_CLUSTER_BACKOFF` code points, not a grapheme cluster either
(combining marks, variation selectors, skin tones, ZWJ sequences, flag pairs).  It knows
nothing of secrets: :func:`memtier.redaction.core.sanitize` redacts first, bounds, and
re-checks the bounded text.
"""

from __future__ import annotations

import unicodedata
from typing import Final

from memtier.errors import ValidationError

__all__ = ["bound_utf8", "encode_utf8", "splits_cluster"]

# Grapheme heuristics of bound_utf8 look back at most this many code points; past that
# (e.g. "zalgo" text with hundreds of combining marks) the cut is only a UTF-8 boundary.
_MAX_CLUSTER_BACKOFF: Final = 32


def encode_utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValidationError(
            "text is not valid Unicode (lone surrogate)", position=exc.start
        ) from None


def _is_extender(ch: str) -> bool:
    """Characters that continue the grapheme cluster before them."""
    o = ord(ch)
    return (
        o == 0x200D  # zero width joiner
        or 0x1F3FB <= o <= 0x1F3FF  # emoji skin-tone modifiers
        or 0xE0020 <= o <= 0xE007F  # emoji tag sequences (subdivision flags)
        or unicodedata.category(ch) in ("Mn", "Me", "Mc")  # combining marks, variation selectors
    )


def _is_regional(ch: str) -> bool:
    return 0x1F1E6 <= ord(ch) <= 0x1F1FF


def splits_cluster(text: str, end: int) -> bool:
    """True if cutting ``text`` before index ``end`` would split a grapheme cluster."""
    if end <= 0 or end >= len(text):
        return False
    if _is_extender(text[end]) or text[end - 1] == "\u200d":
        return True
    if _is_regional(text[end]) and _is_regional(text[end - 1]):
        run = 0
        i = end - 1
        while i >= 0 and _is_regional(text[i]) and run <= _MAX_CLUSTER_BACKOFF:
            run += 1
            i -= 1
        return run % 2 == 1  # a flag is a pair; an odd run ends in half a flag
    return False


def bound_utf8(text: str, max_bytes: int) -> tuple[str, bool]:
    """Cut ``text`` to at most ``max_bytes`` UTF-8 bytes; returns ``(text, truncated)``.

    The cut never splits a code point, and (looking back at most 32 code points) does not
    split a grapheme cluster either: a combining mark, variation selector, skin-tone
    modifier, ZWJ sequence (👩‍💻) or flag pair is dropped whole with its base character.
    Raises :class:`ValidationError` (``invalid_input``) for text that is not valid Unicode
    (lone surrogates) or a negative ``max_bytes``.
    """
    if max_bytes < 0:
        raise ValidationError("max_bytes must be >= 0", max_bytes=max_bytes)
    if len(text) <= max_bytes and text.isascii():  # fast path: ASCII is one byte a character
        return text, False
    data = encode_utf8(text)
    if len(data) <= max_bytes:
        return text, False
    cut = max_bytes
    while cut > 0 and (data[cut] & 0xC0) == 0x80:  # continuation byte: back to a char start
        cut -= 1
    end = len(data[:cut].decode("utf-8"))
    limit = max(0, end - _MAX_CLUSTER_BACKOFF)
    candidate = end
    while candidate > limit and splits_cluster(text, candidate):
        candidate -= 1
    if candidate > limit or not splits_cluster(text, candidate):
        end = candidate
    return text[:end], True
