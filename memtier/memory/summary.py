"""The compaction summary: its model, its rendering and its byte budget (pure, no I/O).

:mod:`memtier.memory.compaction` decides what to fold and applies it; this module turns
the folded turns into the summary JSON.

The summary (stored as JSON in the session hash, ``summary`` field)::

    {"v": 1, "untrusted": true,
     "seq": [first, last], "turns": n, "wall": [from_ms, to_ms],
     "counts": {"avatar": a, "agent": g, "tool": t, "action": x},
     "tools": [[name, n], ...], "tools_other": n,
     "actions": [[name, n], ...], "actions_other": n,
     "text": "..."}

Its size in bytes is the JSON's UTF-8 length, and is what session bytes, the index hash
and the partition total account for.

The budget: compaction never grows a session
    The summary takes at most the smaller of ``max_summary_bytes`` and the bytes it
    replaces (folded turns + previous summary).  If the folded turns cannot hold even the
    counts, more of the oldest turns are folded (up to all).  Still too big, it keeps
    less: without the name lists, then without any facts (``{"untrusted", "text"}``,
    :func:`minimal_summary_bytes`).  A session with no summary whose turns all together
    are smaller than that folds them with no summary.  So a session at its turn bound
    can always make room, and small appends never start failing.  ``facts`` merge
exactly across repeated compactions (counts add up, the span widens); ``text`` is::

    Earlier conversation (compacted): turns 1-120 (120 turns), 2026-11-30T10:00:00Z to ...
    Messages: 50 from the avatar, 50 from the agent, 15 tool results, 5 action results.
    Tools used: search x9, weather x6.
    Actions: teleport x3, give x2.
    Excerpts (oldest first):
    #3 avatar: can you take me to the sandbox?
    #4 action teleport: arrived at Sandbox Island (128, 64, 22)
    ...

Excerpts (who said what, in short: at most :data:`EXCERPT_BYTES` of content each) are
chosen round-robin over action results, tool results and messages, newest first, until
the budget is spent, then printed in sequence order; excerpts of the previous summary
compete with the new ones by the same rule.

Untrusted stays untrusted: the summary is ``untrusted`` when any folded turn came from
the avatar or a tool (or an action outcome), or the previous summary was; ``context()``
then renders it as user-role data inside the visible delimiter.  A summarizer hook
cannot change that flag.

Determinism: the same session state and bounds give the same bytes on any worker -- no
dict-order, locale, time-of-day or randomness dependence (names are sorted, times are
formatted by hand in UTC, JSON by orjson with fixed key order).  Text goes through
:func:`memtier.redaction.sanitize`, whose grapheme heuristics use Python's Unicode
database: run workers on one Python minor version for byte-identical output.

A pluggable :data:`Summarizer` (e.g. an LLM call) may replace the text; the facts, the
untrusted flag, redaction and the byte budget are still applied here.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final

import orjson

from memtier.errors import ScriptError
from memtier.memory.state import UNTRUSTED_KINDS, StoredTurn
from memtier.redaction import sanitize

__all__ = [
    "EXCERPT_BYTES",
    "SUMMARY_VERSION",
    "Summarizer",
    "SummaryFacts",
    "SummaryRequest",
    "build_summary",
    "deterministic_summary",
    "merge_facts",
    "minimal_summary_bytes",
    "with_fallback",
]

log = logging.getLogger("memtier.compaction")

SUMMARY_VERSION: Final = 1
# Content bytes of one excerpt ("who said what, in short").
EXCERPT_BYTES: Final = 200
# Tool / action names listed in the facts (the rest are counted in *_other), and their size.
MAX_FACT_NAMES: Final = 8
FACT_NAME_BYTES: Final = 48
# Shrinking custom summarizer text to its byte budget (JSON escaping can grow it).
_MAX_FIT_ROUNDS: Final = 16

EXCERPTS_HEADER: Final = "Excerpts (oldest first):"
_WS_RE: Final = re.compile(r"[ \t\r\n\f\v]+")
_EXCERPT_RE: Final = re.compile(r"^#(\d{1,20}) (action|tool|avatar|agent)\b")
_KIND_RANK: Final = {"action": 0, "tool": 1, "avatar": 2, "agent": 2}


# --------------------------------------------------------------------------- summary model


@dataclass(frozen=True)
class SummaryFacts:
    """The exact, mergeable facts of everything folded so far."""

    first_seq: int
    last_seq: int
    turns: int
    from_wall_ms: int
    to_wall_ms: int
    avatar: int = 0
    agent: int = 0
    tool: int = 0
    action: int = 0
    tools: tuple[tuple[str, int], ...] = ()
    tools_other: int = 0
    actions: tuple[tuple[str, int], ...] = ()
    actions_other: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "seq": [self.first_seq, self.last_seq],
            "turns": self.turns,
            "wall": [self.from_wall_ms, self.to_wall_ms],
            "counts": {
                "avatar": self.avatar,
                "agent": self.agent,
                "tool": self.tool,
                "action": self.action,
            },
            "tools": [[n, c] for n, c in self.tools],
            "tools_other": self.tools_other,
            "actions": [[n, c] for n, c in self.actions],
            "actions_other": self.actions_other,
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> SummaryFacts | None:
        """The facts of a stored summary, or None if it has none (e.g. a custom format)."""
        try:
            seq, wall, counts = doc["seq"], doc["wall"], doc["counts"]
            return cls(
                first_seq=int(seq[0]),
                last_seq=int(seq[1]),
                turns=int(doc["turns"]),
                from_wall_ms=int(wall[0]),
                to_wall_ms=int(wall[1]),
                avatar=int(counts["avatar"]),
                agent=int(counts["agent"]),
                tool=int(counts["tool"]),
                action=int(counts["action"]),
                tools=tuple((str(n), int(c)) for n, c in doc.get("tools", ())),
                tools_other=int(doc.get("tools_other", 0)),
                actions=tuple((str(n), int(c)) for n, c in doc.get("actions", ())),
                actions_other=int(doc.get("actions_other", 0)),
            )
        except (KeyError, TypeError, ValueError, IndexError):
            return None


def _clean_name(name: str) -> str:
    return sanitize(_WS_RE.sub(" ", name).strip(), FACT_NAME_BYTES).text


def _merge_names(
    previous: Sequence[tuple[str, int]], previous_other: int, new: Sequence[str]
) -> tuple[tuple[tuple[str, int], ...], int]:
    counts: dict[str, int] = {}
    for name, n in previous:
        counts[name] = counts.get(name, 0) + n
    for name in new:
        clean = _clean_name(name)
        counts[clean] = counts.get(clean, 0) + 1
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    kept = tuple(ranked[:MAX_FACT_NAMES])
    other = previous_other + sum(n for _, n in ranked[MAX_FACT_NAMES:])
    return kept, other


def merge_facts(previous: SummaryFacts | None, folded: Sequence[StoredTurn]) -> SummaryFacts:
    """Facts of ``previous`` plus the ``folded`` records (exact counts, widened span)."""
    kinds = [r.kind for r in folded]
    walls = [r.wall_ms for r in folded]
    if previous is None:
        previous = SummaryFacts(
            first_seq=folded[0].seq if folded else 0,
            last_seq=folded[-1].seq if folded else 0,
            turns=0,
            from_wall_ms=min(walls, default=0),
            to_wall_ms=max(walls, default=0),
        )
    tools, tools_other = _merge_names(
        previous.tools,
        previous.tools_other,
        [r.fields.get("tool", "") for r in folded if r.kind == "tool"],
    )
    actions, actions_other = _merge_names(
        previous.actions,
        previous.actions_other,
        [r.fields.get("action", "") for r in folded if r.kind == "action"],
    )
    return SummaryFacts(
        first_seq=previous.first_seq,
        last_seq=max([previous.last_seq, *(r.seq for r in folded)]),
        turns=previous.turns + len(folded),
        from_wall_ms=min([previous.from_wall_ms, *walls]),
        to_wall_ms=max([previous.to_wall_ms, *walls]),
        avatar=previous.avatar + kinds.count("avatar"),
        agent=previous.agent + kinds.count("agent"),
        tool=previous.tool + kinds.count("tool"),
        action=previous.action + kinds.count("action"),
        tools=tools,
        tools_other=tools_other,
        actions=actions,
        actions_other=actions_other,
    )


@dataclass(frozen=True)
class SummaryRequest:
    """What a summarizer gets: the previous text, the merged facts and the folded turns.

    ``budget_bytes`` is the room for the text (JSON-escaped UTF-8 bytes); longer text is
    cut, then redacted again, by the caller.
    """

    previous_text: str | None
    facts: SummaryFacts
    records: tuple[StoredTurn, ...]
    budget_bytes: int
    untrusted: bool


Summarizer = Callable[[SummaryRequest], str]


def with_fallback(summarizer: Summarizer | None) -> Summarizer | None:
    """``summarizer``, falling back to the deterministic one if it raises (inline use:
    an append must not fail because a summarizer service is down)."""
    if summarizer is None:
        return None
    hook = summarizer

    def guarded(request: SummaryRequest) -> str:
        try:
            return hook(request)
        except Exception as exc:
            log.warning("summarizer hook failed (%s); using the deterministic summary", exc)
            return deterministic_summary(request)

    return guarded


# --------------------------------------------------------------------------- rendering


def _esc_len(text: str) -> int:
    """Bytes ``text`` takes inside a JSON string (orjson escaping, without the quotes)."""
    return len(orjson.dumps(text)) - 2


def _utc(ms: int) -> str:
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    return (
        f"{dt.year:04d}-{dt.month:02d}-{dt.day:02d}T{dt.hour:02d}:{dt.minute:02d}:{dt.second:02d}Z"
    )


def _names(items: Sequence[tuple[str, int]], other: int) -> str:
    text = ", ".join(f"{name} x{n}" for name, n in items)
    if other:
        text += f" (+{other} other)"
    return text


def header_lines(facts: SummaryFacts) -> list[str]:
    lines = [
        f"Earlier conversation (compacted): turns {facts.first_seq}-{facts.last_seq}"
        f" ({facts.turns} turns), {_utc(facts.from_wall_ms)} to {_utc(facts.to_wall_ms)}.",
        f"Messages: {facts.avatar} from the avatar, {facts.agent} from the agent,"
        f" {facts.tool} tool results, {facts.action} action results.",
    ]
    if facts.tools or facts.tools_other:
        lines.append(f"Tools used: {_names(facts.tools, facts.tools_other)}.")
    if facts.actions or facts.actions_other:
        lines.append(f"Actions: {_names(facts.actions, facts.actions_other)}.")
    return lines


def excerpt(record: StoredTurn) -> str:
    """``#<seq> <who>: <content>`` on one line, content at most EXCERPT_BYTES (+ "…")."""
    f = record.fields
    if record.kind == "tool":
        who, body = f"tool {_clean_name(f.get('tool', ''))}", f.get("summary", "")
    elif record.kind == "action":
        who, body = f"action {_clean_name(f.get('action', ''))}", f.get("outcome", "")
    else:
        who, body = record.kind, f.get("text", "")
    cleaned = sanitize(_WS_RE.sub(" ", body).strip(), EXCERPT_BYTES)
    return f"#{record.seq} {who}: {cleaned.text}{'…' if cleaned.truncated else ''}"


def _previous_excerpts(text: str | None) -> list[str]:
    if not text:
        return []
    lines = text.split("\n")
    if EXCERPTS_HEADER in lines:
        return [ln for ln in lines[lines.index(EXCERPTS_HEADER) + 1 :] if ln]
    # A summary in another format (a custom summarizer): keep it as one old excerpt.
    flat = _WS_RE.sub(" ", text).strip()
    cut = sanitize(flat, EXCERPT_BYTES * 2)
    return [f"#0 earlier: {cut.text}{'…' if cut.truncated else ''}"] if flat else []


def _excerpt_key(line: str) -> tuple[int, int]:
    """(category rank, seq) of an excerpt line."""
    m = _EXCERPT_RE.match(line)
    if m is None:
        return 2, 0
    return _KIND_RANK[m.group(2)], int(m.group(1))


def deterministic_summary(request: SummaryRequest) -> str:
    """The default summarizer: facts header plus as many excerpts as the budget allows."""
    budget = request.budget_bytes
    lines = [*header_lines(request.facts), EXCERPTS_HEADER]
    # Shorten to fit: drop header lines from the end (excerpts heading, actions, tools,
    # message counts); the first line alone is cut to the budget by the caller.
    while len(lines) > 1 and _esc_len("\n".join(lines)) > budget:
        lines.pop()
    header = "\n".join(lines)
    used = _esc_len(header)
    if used >= budget or lines[-1] != EXCERPTS_HEADER:
        return header  # no room for excerpts (the caller cuts what is still too long)
    candidates = _previous_excerpts(request.previous_text) + [excerpt(r) for r in request.records]
    # Round-robin over categories (actions, tools, messages), newest first in each.
    by_rank: dict[int, list[tuple[int, int, str]]] = {0: [], 1: [], 2: []}
    for order, line in enumerate(candidates):
        rank, seq = _excerpt_key(line)
        by_rank[rank].append((seq, order, line))
    for items in by_rank.values():
        items.sort(key=lambda item: (-item[0], -item[1]))
    ranked: list[tuple[int, int, str]] = []
    for i in range(max((len(v) for v in by_rank.values()), default=0)):
        for rank in (0, 1, 2):
            if i < len(by_rank[rank]):
                ranked.append(by_rank[rank][i])
    chosen: list[tuple[int, int, str]] = []
    for item in ranked:
        cost = 2 + _esc_len(item[2])  # "\n" is two bytes escaped
        if used + cost <= budget:
            chosen.append(item)
            used += cost
    chosen.sort(key=lambda item: (item[0], item[1]))
    return "\n".join([header, *(line for _, _, line in chosen)])


def fit_text(text: str, budget: int) -> str:
    """Redact ``text`` and cut it until its JSON-escaped size fits ``budget`` bytes."""
    if budget <= 0:
        return ""
    clean = sanitize(text, max(0, budget))
    out = clean.text
    for _ in range(_MAX_FIT_ROUNDS):
        over = _esc_len(out) - budget
        if over <= 0:
            return out
        out = sanitize(out, max(0, len(out.encode("utf-8")) - over)).text
    return ""


def build_summary(
    previous: str | None,
    folded: Sequence[StoredTurn],
    max_bytes: int,
    summarizer: Summarizer | None = None,
) -> bytes | None:
    """The new summary JSON (at most ``max_bytes``), or None if even its facts do not fit."""
    prev_doc: dict[str, Any] | None = None
    if previous:
        try:
            loaded = orjson.loads(previous)
            prev_doc = loaded if isinstance(loaded, dict) else None
        except orjson.JSONDecodeError:
            prev_doc = None
    prev_text = prev_doc.get("text") if prev_doc else None
    prev_facts = SummaryFacts.from_json(prev_doc) if prev_doc else None
    untrusted = any(r.kind in UNTRUSTED_KINDS for r in folded) or bool(
        prev_doc is not None and prev_doc.get("untrusted", True)
    )
    facts = merge_facts(prev_facts, folded)

    def doc(f: SummaryFacts | None, text: str) -> bytes:
        if f is None:
            # The minimal summary: no facts, so nothing shows which kinds it folded; it is
            # always marked untrusted (recovery refuses a minimal one that is not).
            return orjson.dumps({"untrusted": True, "text": text})
        return orjson.dumps(
            {"v": SUMMARY_VERSION, "untrusted": untrusted, **f.to_json(), "text": text}
        )

    # Fit ladder: all facts; facts without the name lists (counts kept); no facts.
    without_names = replace(
        facts,
        tools=(),
        tools_other=facts.tools_other + sum(n for _, n in facts.tools),
        actions=(),
        actions_other=facts.actions_other + sum(n for _, n in facts.actions),
    )
    chosen: SummaryFacts | None
    for chosen in (facts, without_names, None):
        overhead = len(doc(chosen, ""))
        if overhead <= max_bytes:
            break
    else:
        return None
    budget = max_bytes - overhead
    request = SummaryRequest(
        previous_text=prev_text if isinstance(prev_text, str) else None,
        facts=chosen or facts,
        records=tuple(folded),
        budget_bytes=budget,
        untrusted=untrusted,
    )
    text = (summarizer or deterministic_summary)(request)
    if not isinstance(text, str):
        raise ScriptError("a summarizer must return str")
    out = doc(chosen, fit_text(text, budget))
    if len(out) > max_bytes:  # unreachable: fit_text measured the escaped size
        out = doc(chosen, "")
    return out


def minimal_summary_bytes() -> int:
    """Bytes of the smallest summary there is (no facts, no text; always untrusted)."""
    return len(orjson.dumps({"untrusted": True, "text": ""}))
