"""The visible untrusted-data delimiter, and neutralising look-alikes of it inside data.

``context()`` wraps avatar input, tool summaries, action results and untrusted summaries
as ``<untrusted-data source="...">\\n<data>\\n</untrusted-data>``.  The data must not be
able to close (or reopen) that delimiter, including with Unicode look-alikes an LLM reads
the same way: ``<\\u200b/untrusted-data>``, ``untrusted\\u2011data``, fullwidth
``\uff1c/untrusted-data\uff1e``, small ``\ufe64``, combining marks, case.

Detection works on a normalised form, built character by character so every position
maps back to the original text: compatibility decomposition (NFKD, which also folds
what NFKC folds: fullwidth and small forms, ligatures, ...), case folding, dropping
format characters (Cf: zero-width space/joiners, BOM, bidi controls, tags), control
characters (Cc, other than spaces), combining marks (Mn, Me) and the invisible Hangul
fillers, every dash (Pd, the minus sign) as
``-`` and every space as `` ``.  A match is ``<``, optional spaces, an optional ``/``,
optional spaces, ``untrusted``, optional separators (``-``, ``_``, spaces), ``data``.
Neutralising rewrites, in the original text, the character that produced the ``<`` of
each match as ``&lt;``; everything else is left as it was.  So on the normalised form of
the result (and on NFKC with format characters removed, which folds less) no delimiter
remains inside the data, and a wrapped message has exactly one opening delimiter at its
start and one closing delimiter at its end.

The ``source`` attribute is escaped as well: any character outside the tool/action name
grammar (:data:`memtier.memory.models.NAME_GRAMMAR`) is percent-encoded (UTF-8), so even a
record that predates the grammar cannot end the attribute.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from typing import Final

__all__ = [
    "UNTRUSTED_CLOSING",
    "escape_delimiters",
    "escape_source",
    "normalise_for_delimiters",
    "untrusted_opening",
    "wrap_untrusted",
]

# Default-ignorable characters that are not Cf/Mn/Me: the Hangul fillers (Lo), which
# render as nothing.
_INVISIBLE_LETTERS: Final = frozenset("\u115f\u1160\u3164\uffa0")
_DROP_CATEGORIES: Final = frozenset({"Cf", "Mn", "Me", "Cc"})
_SOURCE_SAFE_RE: Final = re.compile(r"[A-Za-z0-9_.:-]*")


@lru_cache(maxsize=4096)
def _fold_char(char: str) -> str:
    """The normalised form of one character (possibly empty or several characters)."""
    out = []
    for c in unicodedata.normalize("NFKD", unicodedata.normalize("NFKD", char).casefold()):
        category = unicodedata.category(c)
        if c.isspace() or category == "Zs":
            out.append(" ")
        elif category in _DROP_CATEGORIES or c in _INVISIBLE_LETTERS:
            continue
        elif category == "Pd" or c == "\u2212":
            out.append("-")
        else:
            out.append(c)
    return "".join(out)


# Every character whose normalised form holds "<" (checked over all of Unicode by
# tests/memory/test_untrusted_marking.py): <, NOT LESS-THAN (< + U+0338), small and
# fullwidth <.  Each folds to exactly "<".
OPENERS: Final = "<\u226e\ufe64\uff1c"
_OPENER_RE: Final = re.compile(f"[{OPENERS}]")
_WORD: Final = "untrusted"
_TAIL: Final = "data"


def normalise_for_delimiters(text: str) -> tuple[str, list[int]]:
    """The normalised form of ``text`` and, per normalised character, its original index."""
    chars: list[str] = []
    origin: list[int] = []
    for index, char in enumerate(text):
        folded = _fold_char(char)
        chars.append(folded)
        origin.extend([index] * len(folded))
    return "".join(chars), origin


def _delimiter_at(text: str, start: int) -> bool:
    """Does the normalised text from the opener at ``start`` match the delimiter pattern
    (``< *(/ *)?untrusted[-_ ]*data``)?  Folds lazily, only as far as the match goes:
    each step either advances the pattern or ends the scan, except dropped characters,
    which end at the next opener at the latest -- linear over all openers."""
    state = "lead"  # lead: spaces or "/" allowed; slash: spaces allowed; word; sep; tail
    pos = 0  # index into _WORD or _TAIL
    for index in range(start + 1, len(text)):
        for c in _fold_char(text[index]):
            if state in ("lead", "slash"):
                if c == " ":
                    continue
                if c == "/" and state == "lead":
                    state = "slash"
                    continue
                state, pos = "word", 0
            if state == "word":
                if c != _WORD[pos]:
                    return False
                pos += 1
                if pos == len(_WORD):
                    state = "sep"
                continue
            if state == "sep":
                if c in "-_ ":
                    continue
                state, pos = "tail", 0
            if c != _TAIL[pos]:
                return False
            pos += 1
            if pos == len(_TAIL):
                return True
    return False


def escape_delimiters(text: str) -> str:
    """``text`` with every delimiter look-alike neutralised (see the module docstring)."""
    if "<" not in text and (text.isascii() or not any(c in text for c in OPENERS[1:])):
        return text  # fast path (C speed substring search): nothing can fold to "<"
    starts = [m.start() for m in _OPENER_RE.finditer(text)]
    starts = [i for i in starts if _delimiter_at(text, i)]
    if not starts:
        return text
    parts: list[str] = []
    previous = 0
    for index in starts:
        parts.append(text[previous:index])
        parts.append("&lt;")
        previous = index + 1
    parts.append(text[previous:])
    return "".join(parts)


def escape_source(source: str) -> str:
    """``source`` with every character outside the name grammar percent-encoded."""
    if _SOURCE_SAFE_RE.fullmatch(source):
        return source
    return "".join(
        c if _SOURCE_SAFE_RE.fullmatch(c) else _percent(c.encode("utf-8", "surrogatepass"))
        for c in source
    )


def _percent(raw: bytes) -> str:
    return "".join(f"%{b:02X}" for b in raw)


def _opening(source: str) -> str:
    return f'<untrusted-data source="{escape_source(source)}">\n'


# Sources are "avatar", "summary" and "tool:"/"action:" + a grammar name (<= 64 bytes): a
# small vocabulary, so the escaped opening is built once per source, not once per turn.
_cached_opening: Final = lru_cache(maxsize=4096)(_opening)
_CACHED_SOURCE_CHARS: Final = 80
UNTRUSTED_CLOSING: Final = "\n</untrusted-data>"


def untrusted_opening(source: str) -> str:
    """The opening delimiter (with its newline) for data from ``source``."""
    return _cached_opening(source) if len(source) <= _CACHED_SOURCE_CHARS else _opening(source)


def wrap_untrusted(source: str, text: str) -> str:
    """The visible delimiter around untrusted data handed to an LLM."""
    head = _cached_opening(source) if len(source) <= _CACHED_SOURCE_CHARS else _opening(source)
    return head + escape_delimiters(text) + UNTRUSTED_CLOSING
