"""The local-path scrubber of the threads ledger: absolute local paths become ``[PATH]``.

What a runner reports (tool arguments, error text) often names files on the host that
ran it; the ledger serves events to other clients, so the paths are replaced before a
row is written and again before a stored row is served.  (A copy lives in
``memtier/redaction/paths.py``; the imports move there when both land.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from memtier.errors import ValidationError
from memtier.redaction import redact_json, redact_text

__all__ = ["PATH_PLACEHOLDER", "scrub_json", "scrub_paths", "served_json", "served_text"]

# Absolute local paths (POSIX roots where users' files live, Windows drives, ~/, file://).
_LOCAL_PATH_RE: Final = re.compile(
    r"(?:file://[^\s\"'<>]{1,4096}+"
    r"|(?<![\w.:/~-])(?:/(?:home|Users|root|tmp|var|etc|opt|srv|mnt|media|private|usr"
    r"|Library|Volumes|proc|run|workspace|work|data|app)(?:/[^\s\"'<>|:]{0,4096}+)?"
    r"|~/[^\s\"'<>|:]{0,4096}+"
    r"|[A-Za-z]:\\[^\s\"'<>|]{0,4096}+))"
)
PATH_PLACEHOLDER: Final = "[PATH]"
_MAX_SERVED_DEPTH: Final = 32


def scrub_paths(text: str) -> str:
    """Replace absolute local paths (and file:// URLs) with ``[PATH]``."""
    return _LOCAL_PATH_RE.sub(PATH_PLACEHOLDER, text)


def served_text(text: str, *, scrub: bool) -> str:
    """A stored string as it may be served: secrets redacted (and local paths if ``scrub``)."""
    cleaned = redact_text(text)
    return scrub_paths(cleaned) if scrub else cleaned


def served_json(value: Any, *, scrub: bool) -> Any:
    """A stored JSON value as it may be served: every string (keys too) redacted, local
    paths scrubbed if ``scrub``; sensitive key names lose their values (redact_json)."""
    redacted, _ = redact_json(scrub_json(value) if scrub else value, max_depth=32)
    return redacted


def scrub_json(node: Any, depth: int = 0) -> Any:
    """A copy of a JSON value with local paths scrubbed from every string (keys too)."""
    if depth > _MAX_SERVED_DEPTH:
        raise ValidationError("JSON value nested too deeply")
    if isinstance(node, str):
        return scrub_paths(node)
    if isinstance(node, list | tuple):
        return [scrub_json(item, depth + 1) for item in node]
    if isinstance(node, Mapping):
        return {scrub_paths(str(k)): scrub_json(v, depth + 1) for k, v in node.items()}
    return node
