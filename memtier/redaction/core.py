"""The redaction engine: run the detectors, then bound, until the text is clean.

Owns the public operations :func:`redact` (one pass of every detector, repeated to a fixpoint
within a bound), :func:`redact_text`, :func:`contains_secret`, :func:`redact_json` /
:func:`json_contains_secret` (threads events and exports, snapshot recovery) and
:func:`sanitize` (normalise, redact, bound, re-check: the one call the store uses).  What a
secret looks like is :mod:`memtier.redaction.patterns`; how each match is replaced and in
which order, :mod:`memtier.redaction.detectors`; what is skipped unrun,
:mod:`memtier.redaction.prefilter`; the byte bound, :mod:`memtier.redaction.bounding`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

from memtier.errors import ValidationError
from memtier.redaction.assignments import apply_assignments, not_a_value
from memtier.redaction.bounding import bound_utf8, encode_utf8
from memtier.redaction.detectors import DETECTORS, Detector
from memtier.redaction.patterns import SECRET_NAME_RE
from memtier.redaction.placeholders import (
    FALLBACK_TEXT,
    SecretKind,
    is_placeholder,
    normalize_controls,
    placeholder,
    sorted_kinds,
)
from memtier.redaction.prefilter import run_filtered

__all__ = [
    "MAX_SANITIZE_ROUNDS",
    "REDACTOR_VERSION",
    "RedactionResult",
    "SanitizedText",
    "contains_secret",
    "json_contains_secret",
    "redact",
    "redact_json",
    "redact_once",
    "redact_text",
    "redact_text_remembered",
    "sanitize",
]

# A secret that the bounded text re-exposes is redacted again; after this many rounds
# (never reached by real text: each round needs a new cut-created match) sanitize gives up
# on the content and stores FALLBACK_TEXT instead -- fail closed.
MAX_SANITIZE_ROUNDS: Final = 4
# The version of this redactor, stamped into every turn record the store writes (see
# memtier.memory.turncodec).  Raise it whenever a change lets redact() catch a secret it
# missed before (a new pattern, a wider one): a reader may then trust records stamped with
# the current version and re-check only the older ones.
REDACTOR_VERSION: Final = 1
# bound JSON nesting in redact_json (threads events and exports are shallow).
_MAX_JSON_DEPTH: Final = 64
# Object keys redact() left unchanged: event and export data repeat a few key names
# ("content", "entryId", ...) on every row, and redacting them again was about half of
# the redaction of a ledger page read cold.  Only a clean key is remembered (never a
# string a detector changed), only a short one, and at most _MAX_CLEAN_KEYS of them; once
# full, further keys are redacted every time.  redact() is a pure function of the text.
_CLEAN_KEYS: Final[set[str]] = set()
_MAX_CLEAN_KEYS: Final = 4096
_MAX_CLEAN_KEY_CHARS: Final = 64
# The same for whole strings served again and again (thread titles: one on every claim,
# one per thread of a list page): redacting a title was a twentieth of a continue's own
# client work.  At most _MAX_CLEAN_TEXTS of up to _MAX_CLEAN_TEXT_CHARS characters.
_CLEAN_TEXTS: Final[set[str]] = set()
_MAX_CLEAN_TEXTS: Final = 4096
_MAX_CLEAN_TEXT_CHARS: Final = 256


def _run_detector(detector: Detector, text: str, counts: dict[SecretKind, int]) -> str | None:
    """Replace every match of one detector, counting kinds; the new text, or None if unchanged."""
    before = len(counts), sum(counts.values())

    def sub(m: re.Match[str]) -> str:
        result = detector.replace(m)
        if result is None:
            return m.group(0)
        new, kinds = result
        for kind in kinds:
            counts[kind] = counts.get(kind, 0) + 1
        return new

    text = detector.pattern.sub(sub, text)
    return text if (len(counts), sum(counts.values())) != before else None


def redact_once(text: str) -> tuple[str, dict[SecretKind, int]]:
    """One pass of every detector, in order; returns the text and counts per kind."""
    counts: dict[SecretKind, int] = {}
    text = run_filtered(DETECTORS, text, _run_detector, counts)
    # Last: specific formats first (GITHUB_TOKEN=ghp_... reports github_token).
    text = apply_assignments(text, counts)
    return text, counts


# --- public API: redaction ---------------------------------------------------------------------


class RedactionResult(NamedTuple):
    """Redacted text and the kinds found (unique, in :class:`SecretKind` order).

    A 2-tuple, so ``text, kinds = redact(raw)`` works.
    """

    text: str
    kinds: tuple[SecretKind, ...]

    @property
    def redacted(self) -> bool:
        return bool(self.kinds)


def redact(text: str) -> RedactionResult:
    """Replace every secret in ``text`` with ``[REDACTED:<kind>]``; remove control characters.

    Deterministic and idempotent.  Never raises for any ``str`` (lone surrogates pass
    through; :func:`bound_utf8` and :func:`sanitize` refuse them).  Linear in ``len(text)``.
    """
    text = normalize_controls(text)
    found: dict[SecretKind, int] = {}
    # One pass is already a fixpoint for everything the tests generate; the loop is a
    # bounded safety net (a replacement can never create a new match by design).
    for _ in range(3):
        text, counts = redact_once(text)
        if not counts:
            break
        for kind, n in counts.items():
            found[kind] = found.get(kind, 0) + n
    return RedactionResult(text, sorted_kinds(found) if found else ())


def redact_text(text: str) -> str:
    """:func:`redact` returning only the text."""
    return redact(text).text


def _remembered(memo: set[str], text: str, max_chars: int, max_items: int) -> RedactionResult:
    """:func:`redact` of ``text``, answered from ``memo`` (strings it left unchanged) when
    it is there; a clean ``text`` of up to ``max_chars`` characters is added while the memo
    holds fewer than ``max_items``.  Exact: redact() is a pure function of the text."""
    if text in memo:
        return RedactionResult(text, ())
    result = redact(text)
    clean = not result.kinds and result.text == text
    if clean and len(text) <= max_chars and len(memo) < max_items:
        memo.add(text)
    return result


def redact_text_remembered(text: str) -> str:
    """:func:`redact_text` for strings served again and again (thread titles): the same
    result, without running the detectors again on a short string they left unchanged."""
    return _remembered(_CLEAN_TEXTS, text, _MAX_CLEAN_TEXT_CHARS, _MAX_CLEAN_TEXTS).text


def contains_secret(text: str) -> bool:
    """True iff any pattern matches ``text`` (after control-character removal).

    Snapshot recovery uses it: a stored record for which this is True is rejected.
    """
    _, counts = redact_once(normalize_controls(text))
    return bool(counts)


def redact_json(
    value: Any, *, max_depth: int = _MAX_JSON_DEPTH
) -> tuple[Any, tuple[SecretKind, ...]]:
    """Redact every string (keys included) of a JSON value (threads events and exports).

    A string value under a sensitive key name (``"password"``, ``"api_key"``,
    ``"sessionToken"``...) is replaced whole, because a bare value carries no pattern.
    Returns ``(redacted copy, kinds)``.  Raises :class:`ValidationError` for nesting
    deeper than ``max_depth`` or a value that is not JSON (dict with str keys, list,
    tuple, str, int, float, bool, None).
    """
    found: set[SecretKind] = set()

    def walk(node: Any, depth: int) -> Any:
        if depth > max_depth:
            raise ValidationError("JSON value nested too deeply", max_depth=max_depth)
        if isinstance(node, str):
            result = redact(node)
            found.update(result.kinds)
            return result.text
        if node is None or isinstance(node, bool | int | float):
            return node
        if isinstance(node, list | tuple):
            return [walk(item, depth + 1) for item in node]
        if isinstance(node, dict):
            out: dict[str, Any] = {}
            for key, item in node.items():
                if not isinstance(key, str):
                    raise ValidationError("JSON object keys must be strings")
                if depth < max_depth and key in _CLEAN_KEYS:
                    new_key = key  # (at max_depth walk(key) raises, as it always did)
                elif depth < max_depth:
                    cleaned = _remembered(_CLEAN_KEYS, key, _MAX_CLEAN_KEY_CHARS, _MAX_CLEAN_KEYS)
                    found.update(cleaned.kinds)
                    new_key = cleaned.text
                else:
                    new_key = walk(key, depth + 1)
                if (
                    isinstance(item, str)
                    and item
                    and not is_placeholder(item)
                    and SECRET_NAME_RE.fullmatch(key)
                    and not not_a_value(item)
                ):
                    found.add(SecretKind.SECRET_ASSIGNMENT)
                    out[new_key] = placeholder(SecretKind.SECRET_ASSIGNMENT)
                else:
                    out[new_key] = walk(item, depth + 1)
            return out
        raise ValidationError("not a JSON value", type=type(node).__name__)

    redacted = walk(value, 0)
    return redacted, sorted_kinds(list(found))


def json_contains_secret(value: Any, *, max_depth: int = _MAX_JSON_DEPTH) -> bool:
    """True iff :func:`redact_json` would change ``value`` (recovery validation of records)."""
    return bool(redact_json(value, max_depth=max_depth)[1])


# --- public API: the one call the store uses ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class SanitizedText:
    """Text ready for the store: control characters removed, redacted, then bounded."""

    text: str
    byte_length: int
    kinds: tuple[SecretKind, ...]
    truncated: bool

    @property
    def redacted(self) -> bool:
        return bool(self.kinds)


def sanitize(text: str, max_bytes: int) -> SanitizedText:
    """Normalize, redact, then bound ``text`` to ``max_bytes`` UTF-8 bytes.

    If the cut exposes a new match (``AKIA`` + 17 characters cut to ``AKIA`` + 16), the
    bounded text is redacted and bounded again, up to :data:`MAX_SANITIZE_ROUNDS` rounds;
    should that not converge, the content is replaced by :data:`FALLBACK_TEXT` (cut to
    ``max_bytes``).  The result never satisfies :func:`contains_secret`.
    Raises :class:`ValidationError` (``invalid_input``) for lone surrogates or a negative
    ``max_bytes``.  Work is linear in ``len(text)``: callers should refuse absurdly large
    input before calling (the store bounds request sizes).
    """
    if max_bytes < 0:
        raise ValidationError("max_bytes must be >= 0", max_bytes=max_bytes)
    if not text.isascii():
        encode_utf8(text)  # refuse lone surrogates before doing any work (ASCII has none)
    result = redact(text)
    out, truncated = bound_utf8(result.text, max_bytes)
    found = result.kinds  # already unique and in order
    # Text with nothing redacted and nothing cut is final (the common case); otherwise check
    # again (a cut can expose a new match; and never rely on redact()'s bounded fixpoint
    # loop alone).
    if truncated or found:
        kinds = set(found)
        rounds = 1
        while contains_secret(out):
            if rounds >= MAX_SANITIZE_ROUNDS:
                out, _ = bound_utf8(FALLBACK_TEXT, max_bytes)
                truncated = True
                break
            again = redact(out)
            kinds.update(again.kinds)
            out, cut = bound_utf8(again.text, max_bytes)
            truncated = truncated or cut
            rounds += 1
        found = sorted_kinds(list(kinds))
    nbytes = len(out) if out.isascii() else len(out.encode("utf-8"))
    return SanitizedText(out, nbytes, found, truncated)
