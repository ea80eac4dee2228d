"""Redaction and bounding of untrusted text: pure, I/O-free, run on every append.

Text reaches Redis, logs and snapshot files only after :func:`sanitize` (or
:func:`redact` followed by :func:`bound_utf8`) ran in the caller's process.

Order: **redact first, then bound.**  Cutting first could split a secret so
that the remaining half no longer matches its pattern (``ghp_`` + 20 of its 36
characters) and would be stored in clear.  The opposite hazard -- a cut that
turns a harmless over-long run into something that now matches (``AKIA`` + 17
characters cut to ``AKIA`` + 16) -- is closed by :func:`sanitize`, which
re-checks the bounded text and redacts again (at most
:data:`MAX_SANITIZE_ROUNDS` rounds, then it returns :data:`FALLBACK_TEXT`).

Guarantees (property-tested in ``tests/test_redaction.py``):

* deterministic, and idempotent: ``redact(redact(x).text) == redact(x)``'s text;
* placeholders (``[REDACTED:<kind>]``) never match any pattern, so
  ``contains_secret(redact(x).text)`` is ``False``;
* linear time, and fast (about 1 ms for 16 KiB of chat or JSON): every regex
  starts with a literal character, so the engine skips straight to candidates
  (one pattern per case where needed: ``Bearer``/``bearer``); a match can start
  only at the beginning of a token run; every quantifier is bounded or
  possessive (``*+``, ``{m,n}+``: nothing backtracks into it), and the values
  that get replaced (URL parts, key bodies, header and assignment values) are
  possessive runs consumed whole, so a second pass finds nothing left.  The
  ``name=value`` rule finds ``:``/``=`` with ``str.find`` and matches the
  name backwards from there.

Control characters: :func:`redact` removes C0 controls except TAB, LF and CR,
DEL and C1 controls (U+0080..U+009F).  They have no place in chat text, and a
NUL inside a token (``gh\\x00p_...``) would otherwise hide it from the
patterns.  Text that cannot be encoded as UTF-8 (a lone surrogate) is refused
by :func:`bound_utf8` and :func:`sanitize` with a
:class:`~memtier.errors.ValidationError` (code ``invalid_input``).

Every pattern, with an example, is listed in README.md (section *Redaction and text bounding*).

Layout, one concern per module (this package re-exports the public API: import from here):

* :mod:`~memtier.redaction.placeholders` -- :class:`SecretKind`, :func:`placeholder`,
  :data:`FALLBACK_TEXT`, :func:`normalize_controls`;
* :mod:`~memtier.redaction.patterns` -- the pattern table, as data;
* :mod:`~memtier.redaction.shapes` -- what a matched value must look like (digits, decodes);
* :mod:`~memtier.redaction.detectors` -- each pattern with its replacement rule, in run order;
* :mod:`~memtier.redaction.assignments` -- the generic ``name=value`` rule;
* :mod:`~memtier.redaction.prefilter` -- which detectors cannot match and are skipped;
* :mod:`~memtier.redaction.bounding` -- :func:`bound_utf8`;
* :mod:`~memtier.redaction.core` -- :func:`redact`, :func:`contains_secret`,
  :func:`redact_json`, :func:`sanitize` (the engine);
* :mod:`~memtier.redaction.paths` -- :func:`scrub_paths`, :func:`served_text`,
  :func:`served_json`, :func:`scrub_json_paths`: absolute local paths out of what the
  threads API serves.

Adding a secret format: a :class:`SecretKind`, its regex in ``patterns`` (a ``TokenSpec``
for a plain token, else a pattern plus a replacement rule and its place in ``detectors``),
a row in the README table and a maker in ``tests/adversarial/secretgen.py``.
"""

from __future__ import annotations

from memtier.redaction.bounding import bound_utf8
from memtier.redaction.core import (
    MAX_SANITIZE_ROUNDS,
    REDACTOR_VERSION,
    RedactionResult,
    SanitizedText,
    contains_secret,
    json_contains_secret,
    redact,
    redact_json,
    redact_text,
    sanitize,
)
from memtier.redaction.paths import (
    PATH_PLACEHOLDER,
    scrub_json_paths,
    scrub_paths,
    served_json,
    served_text,
)
from memtier.redaction.placeholders import (
    FALLBACK_TEXT,
    SecretKind,
    normalize_controls,
    placeholder,
)

__all__ = [
    "FALLBACK_TEXT",
    "MAX_SANITIZE_ROUNDS",
    "PATH_PLACEHOLDER",
    "REDACTOR_VERSION",
    "RedactionResult",
    "SanitizedText",
    "SecretKind",
    "bound_utf8",
    "contains_secret",
    "json_contains_secret",
    "normalize_controls",
    "placeholder",
    "redact",
    "redact_json",
    "redact_text",
    "sanitize",
    "scrub_json_paths",
    "scrub_paths",
    "served_json",
    "served_text",
]
