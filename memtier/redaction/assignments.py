"""The generic ``name=value`` rule: values of sensitive names, found without a forward regex.

Owns the last detector of every pass: a value after ``:``, ``=``, ``:=`` or ``=>`` whose
name ENDS with a sensitive word (``password``, ``api_key``, ``sessionToken``...; the list is
:data:`~memtier.redaction.patterns.SECRET_WORDS`) is replaced, in env files, query and
connection strings, JSON, YAML, HTTP headers and prose; an AWS secret key is recognised only
here (40 base64 characters under an AWS secret name).  Separators are found with
``str.find`` and the name is matched backwards from each, on the reversed text: a forward
keyword-first regex costs ~5x more.  It runs after the specific formats, so
``GITHUB_TOKEN=ghp_...`` reports ``github_token``.  :func:`not_a_value` (``${VAR}``,
``<your-key>``, ``null``, ``****``...) is shared with
:func:`memtier.redaction.core.redact_json`.
"""

from __future__ import annotations

import re

from memtier.redaction.patterns import (
    AWS_SECRET_NAME_RE,
    AWS_SECRET_VALUE_RE,
    EMPTY_VALUE_RE,
    KEYWORD_BEFORE_SEP_REVERSED,
    NAME_CHARS,
    NOT_A_VALUE_RE,
    PLACEHOLDER_TRAILER,
    VALUE_IN_QUOTES_RES,
    VALUE_RE,
    WORD_ENDINGS,
)
from memtier.redaction.placeholders import SecretKind, is_placeholder, placeholder
from memtier.redaction.shapes import has_digit

__all__ = ["apply_assignments", "not_a_value"]


def not_a_value(raw: str) -> bool:
    for cut in range(4):  # the value itself, then without 1..3 trailing punctuation marks
        if cut and (len(raw) <= cut or raw[-cut] not in PLACEHOLDER_TRAILER):
            return False
        if NOT_A_VALUE_RE.fullmatch(raw, 0, len(raw) - cut) is not None:
            return True
    return False


def _name_start(text: str, kw_start: int) -> int:
    start = kw_start
    limit = max(0, kw_start - 64)
    while start > limit and text[start - 1] in NAME_CHARS:
        start -= 1
    return start


def _assignment_value(text: str, at: int, open_quote: str) -> re.Match[str] | None:
    """The value after the separator ending at ``at``.

    ``open_quote`` is the quote that opened a string the name stands in (``"PASSWORD=x"``,
    ``'mysql --password=y'``), or ``""``: there, an unquoted value also ends at that string's
    unescaped closing quote, which is structure, not password.
    """
    if open_quote:
        value = VALUE_RE.match(text, at)
        if value is not None and value.group("edq") is not None:
            return value  # an escaped quote does not close the string
        if value is not None and value.group("bare") is None:
            quote = text[value.start("dq" if value.group("dq") is not None else "sq") - 1]
            # The string's own closing quote ("PASSWORD=" + pw) leaves no value; another
            # quote opens a value of its own ("cmd='x'").
            return None if quote == open_quote else value
        return VALUE_IN_QUOTES_RES[open_quote].match(text, at)
    return VALUE_RE.match(text, at)


def _assignment_kind(
    text: str, name_start: int, name_end: int, quoted: bool, sep: str, value: re.Match[str]
) -> tuple[str, SecretKind] | None:
    """Decide whether one ``name<sep>value`` is a secret: (value group, kind) or None."""
    groups = value.groupdict()
    if groups.get("tmpl") is not None:
        return None  # a template expression ({{ db_password }}), with its spaces
    group = next(g for g in ("dq", "sq", "edq", "bare") if groups.get(g) is not None)
    raw = value.group(group)
    if is_placeholder(raw) or not_a_value(raw):
        return None
    if group == "bare" and EMPTY_VALUE_RE.match(raw):
        return None
    start = name_start
    name = text[start:name_end]
    quoted = quoted or (start > 0 and text[start - 1] in "\"'")
    if name.lower().endswith("pwd") and raw.startswith(("/", "~")):
        return None  # PWD=/home/user is the working directory
    # YAML / header / prose colon form: "password: hunter2" yes, "Token: the" no.
    if sep == ":" and group == "bare" and not quoted and not (has_digit(raw) or len(raw) >= 16):
        return None
    if AWS_SECRET_NAME_RE.search(name) and AWS_SECRET_VALUE_RE.fullmatch(raw):
        return group, SecretKind.AWS_SECRET_KEY
    return group, SecretKind.SECRET_ASSIGNMENT


def _separators(text: str) -> list[int]:
    """Positions of ':' and '=' in order (str.find runs at memchr speed; a regex class does not).

    The "=" of ":=" is skipped: it is the second character of the separator before it.
    """
    found: list[int] = []
    for ch in ":=":
        at = text.find(ch)
        while at >= 0:
            if not (ch == "=" and at and text[at - 1] == ":"):
                found.append(at)
            at = text.find(ch, at + 1)
    found.sort()
    return found


def apply_assignments(text: str, counts: dict[SecretKind, int]) -> str:
    """Redact the values of ``name=value`` / ``name: value`` pairs with a sensitive name."""
    pieces: list[str] = []
    last = 0
    size = len(text)
    reversed_text = ""
    for at in _separators(text):
        if at < last:
            continue  # inside a value already replaced
        end = at
        while end > 0 and text[end - 1] in " \t\"'\\" and at - end < 8:
            end -= 1
        if text[max(0, end - 3) : end].lower() not in WORD_ENDINGS:
            continue
        if not reversed_text:
            reversed_text = text[::-1]
        kw = KEYWORD_BEFORE_SEP_REVERSED.match(reversed_text, size - at)
        if kw is None:
            continue
        sep = text[at : at + 2] if text.startswith((":=", "=>"), at) else text[at]
        name_end = size - kw.end("q0")
        name_start = _name_start(text, size - kw.end())
        # A quote right before the name opens a string the assignment stands in, unless the
        # name closes it itself ("password": ...).
        open_quote = ""
        if not kw.group("q0") and name_start > 0 and text[name_start - 1] in "\"'":
            open_quote = text[name_start - 1]
        value = _assignment_value(text, at + len(sep), open_quote)
        if value is None:
            continue
        decided = _assignment_kind(text, name_start, name_end, bool(kw.group("q0")), sep, value)
        if decided is None:
            continue
        group, kind = decided
        begin, end = value.span(group)
        pieces.append(text[last:begin])
        pieces.append(placeholder(kind))
        last = end
        counts[kind] = counts.get(kind, 0) + 1
    if not pieces:
        return text
    pieces.append(text[last:])
    return "".join(pieces)
