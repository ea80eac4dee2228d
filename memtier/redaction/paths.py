"""Local-path scrubbing: absolute paths of the user's machine out of what is served.

Owns :func:`scrub_paths` (absolute POSIX paths under the roots where users' files live,
Windows drive paths, ``~/`` and ``file://`` URLs become :data:`PATH_PLACEHOLDER`) and the two
"as it may be served" helpers of the threads API: :func:`served_text` and
:func:`served_json` (secrets redacted always, local paths when ``scrub``).  A path is not a
secret, so :func:`~memtier.redaction.redact` keeps it; the threads ledger and its exports
leave a user's directory layout out (docs/threads.md).

Moved here from ``memtier/threads/core.py`` (issue 13: the path scrubber moves into
redaction); the threads modules import it from :mod:`memtier.redaction` once they are
repointed.  Two leaks of that copy are closed here (tests/test_redaction_paths.py pins
them): a first component that merely starts with a root name (``/workspaces/alice``) lost
only the root name, and a path after ``:`` was not scrubbed at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from memtier.errors import ValidationError
from memtier.redaction.core import redact_json, redact_text_remembered

__all__ = ["PATH_PLACEHOLDER", "scrub_json_paths", "scrub_paths", "served_json", "served_text"]

# Absolute local paths (POSIX roots where users' files live, Windows drives, ~/, file://).
# A path starts at the beginning of the text or after a character that cannot continue a
# word, a relative path or a URL host (``[\w./~-]``); a ":" before it is a separator, so the
# second entry of ``PATH=/usr/bin:/home/alice/bin``, a remote ``host:/home/alice`` and
# ``C:/Users/alice`` are paths too.  After a root, the whole run of path characters goes:
# ``/workspaces/alice`` or ``/datasets/alice`` is scrubbed whole, not cut after the root
# name ("[PATH]s/alice" would serve the rest).
_LOCAL_PATH_RE: Final = re.compile(
    r"(?:file://[^\s\"'<>]{1,4096}+"
    r"|(?<![\w./~-])(?:/(?:home|Users|root|tmp|var|etc|opt|srv|mnt|media|private|usr"
    r"|Library|Volumes|proc|run|workspace|work|data|app)[^\s\"'<>|:]{0,4096}+"
    r"|~/[^\s\"'<>|:]{0,4096}+"
    r"|[A-Za-z]:\\[^\s\"'<>|]{0,4096}+))"
)
PATH_PLACEHOLDER: Final = "[PATH]"

_MAX_SERVED_DEPTH: Final = 32


def scrub_paths(text: str) -> str:
    """Replace absolute local paths (and file:// URLs) with ``[PATH]``."""
    # Every alternative of the pattern holds a "/" or ":\\": text with neither (most chat
    # text) cannot match, and a substring search is far cheaper than the pattern.
    if "/" not in text and ":\\" not in text:
        return text
    return _LOCAL_PATH_RE.sub(PATH_PLACEHOLDER, text)


def served_text(text: str, *, scrub: bool) -> str:
    """A stored string as it may be served: secrets redacted (and local paths if ``scrub``).
    (Served again and again -- a thread's title on every claim -- a short string the
    detectors left unchanged is remembered: :func:`redact_text_remembered`.)"""
    cleaned = redact_text_remembered(text)
    return scrub_paths(cleaned) if scrub else cleaned


def served_json(value: Any, *, scrub: bool) -> Any:
    """A stored JSON value as it may be served: every string (keys too) redacted, local
    paths scrubbed if ``scrub``; sensitive key names lose their values (redact_json)."""
    redacted, _ = redact_json(_scrub_json(value, 0) if scrub else value, max_depth=32)
    return redacted


def scrub_json_paths(value: Any) -> Any:
    """:func:`scrub_paths` applied to every string of a JSON value, keys included.

    Raises :class:`~memtier.errors.ValidationError` for nesting deeper than 32.
    """
    return _scrub_json(value, 0)


def _scrub_json(node: Any, depth: int) -> Any:
    if depth > _MAX_SERVED_DEPTH:
        raise ValidationError("JSON value nested too deeply")
    if isinstance(node, str):
        return scrub_paths(node)
    if isinstance(node, list | tuple):
        return [_scrub_json(item, depth + 1) for item in node]
    if isinstance(node, Mapping):
        return {scrub_paths(str(k)): _scrub_json(v, depth + 1) for k, v in node.items()}
    return node
