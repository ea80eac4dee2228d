"""The one validator of stored turn content, shared by the live path and snapshot recovery.

``append`` runs :func:`check_record` on what it is about to store (after redaction and
bounding); a snapshot flush and a recovery run it on every record read back.  So a
record the live path stores is always flushable, and a recovery accepts exactly what the
live path could have stored: the turn model (and any name grammar it enforces), the
exact field set of the kind, no control characters (the sanitiser removes them), names
of 1..:data:`~memtier.limits.MAX_NAME_BYTES` bytes, a body within the hard ceilings.

Secrets are checked by the caller in one batched pass (see
``snapshot.validation.check_no_secrets``): the sanitiser guarantees their absence on the
live path.

Summaries: :func:`check_summary` accepts exactly the documents compaction writes, and
refuses ``untrusted: false`` whenever the summary's own facts count a turn that came from
the avatar, a tool or an action (compaction never lowers the flag then).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from memtier import limits
from memtier.errors import ValidationError
from memtier.memory.models import name_problem
from memtier.memory.turncodec import KIND_FIELDS
from memtier.redaction import contains_secret, normalize_controls

__all__ = [
    "RecordInvalid",
    "check_fields_for_append",
    "check_record",
    "check_summary",
    "check_turn_id_for_append",
]

NAME_FIELDS: Final = ("tool", "action")
# Kinds whose first field is a name (check_name's grammar): the tool and action turns.
NAME_KINDS: Final = frozenset({"tool", "action"})
# The turn models' TurnId pattern (memtier.memory.models), for re.fullmatch.
_TURN_ID_RE: Final = re.compile(r"[A-Za-z0-9._:\-]{1,128}")
BODY_FIELDS: Final = ("text", "summary", "outcome")
MINIMAL_SUMMARY_KEYS: Final = frozenset({"untrusted", "text"})  # compaction's last resort
SUMMARY_KEYS: Final = frozenset(
    {
        "v",
        "untrusted",
        "seq",
        "turns",
        "wall",
        "counts",
        "tools",
        "tools_other",
        "actions",
        "actions_other",
        "text",
    }
)
_COUNT_KINDS: Final = ("avatar", "agent", "tool", "action")
_MAX_INT: Final = 2**53
_MAX_TOOL_RESULT: Final = int(limits.MAX_TOOL_RESULT_BYTES.ceiling)
_MAX_TURN: Final = int(limits.MAX_TURN_BYTES.ceiling)


class RecordInvalid(Exception):
    """One record or summary the live path could not have stored (``reason``: a word)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _no_controls(what: str, value: str) -> None:
    if normalize_controls(value) != value:
        raise RecordInvalid("invalid_record", f"{what} holds control characters")


def check_record(
    kind: Any, fields: Any, turn_id: Any, *, max_turn_bytes: int = 0
) -> dict[str, int]:
    """Raise :class:`RecordInvalid` unless the live path could store this content.

    ``max_turn_bytes`` (0 = the hard ceiling) bounds the whole record.  Returns the UTF-8
    size of each field.
    """
    if not isinstance(kind, str) or kind not in KIND_FIELDS:
        raise RecordInvalid("invalid_record", "unknown kind")
    if (
        not isinstance(fields, dict)
        or tuple(fields) != KIND_FIELDS[kind]
        or not all(isinstance(v, str) for v in fields.values())
    ):
        raise RecordInvalid("invalid_record", "content fields")
    if not isinstance(turn_id, str):
        raise RecordInvalid("invalid_record", "turn id")
    # Plain loops rather than generators: a flush and a recovery run this on every record.
    sizes: dict[str, int] = {}
    total = 0
    for name, value in fields.items():
        _no_controls(name, value)
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:  # lone surrogates: never stored by the live path
            raise RecordInvalid("invalid_record", f"{name} is not UTF-8") from None
        sizes[name] = size
        total += size
    if kind in ("tool", "action"):
        name_field, body_field = KIND_FIELDS[kind]
        if not 1 <= sizes[name_field] <= limits.MAX_NAME_BYTES:
            raise RecordInvalid("invalid_record", f"{name_field} name size")
        if sizes[body_field] > _MAX_TOOL_RESULT:
            raise RecordInvalid("invalid_record", "tool result size")
    if total > (max_turn_bytes or _MAX_TURN):
        raise RecordInvalid("invalid_record", "turn size")
    # The turn model's own checks, without building it (a flush and a recovery come here
    # for every record): its turn-id pattern, matched in full, and the name grammar and
    # secret check of check_name for a tool or action name.  The field set and types
    # were checked above.  tests/test_recordcheck_model.py pins that this refuses
    # exactly what TURN_TYPES[kind](turn_id=..., **fields) refuses.
    if _TURN_ID_RE.fullmatch(turn_id) is None or (
        kind in NAME_KINDS and name_problem(fields[KIND_FIELDS[kind][0]]) is not None
    ):
        raise RecordInvalid("invalid_record", f"the {kind} turn model refuses it")
    return sizes


def _int(value: Any) -> bool:
    return type(value) is int and 0 <= value <= _MAX_INT


def _pair(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and all(_int(v) for v in value)


def _names(value: Any) -> list[str]:
    if not isinstance(value, list):
        raise RecordInvalid("invalid_summary", "summary name list")
    out = []
    for item in value:
        if not (
            isinstance(item, list)
            and len(item) == 2
            and isinstance(item[0], str)
            and _int(item[1])
            and 1 <= len(item[0].encode("utf-8", "surrogatepass")) <= limits.MAX_NAME_BYTES
        ):
            raise RecordInvalid("invalid_summary", "summary name list")
        out.append(item[0])
    return out


def _check_texts(texts: list[tuple[str, str]]) -> None:
    for what, text in texts:
        _no_controls(what, text)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise RecordInvalid("invalid_summary", f"{what} is not UTF-8") from None


def check_summary(doc: Any) -> list[tuple[str, str]]:
    """Raise :class:`RecordInvalid` unless ``doc`` is a summary compaction could write.

    Returns every string of it (``(what, text)``) for the caller's secret check.
    """
    if isinstance(doc, dict) and set(doc) == MINIMAL_SUMMARY_KEYS:
        if doc["untrusted"] is not True or not isinstance(doc["text"], str):
            raise RecordInvalid("invalid_summary", "a minimal summary is always untrusted")
        texts = [("summary text", doc["text"])]
        _check_texts(texts)
        return texts
    if not isinstance(doc, dict) or set(doc) != SUMMARY_KEYS:
        raise RecordInvalid("invalid_summary", "summary fields")
    counts = doc["counts"]
    if (
        not _int(doc["v"])
        or doc["v"] < 1
        or not isinstance(doc["untrusted"], bool)
        or not isinstance(doc["text"], str)
        or not _pair(doc["seq"])
        or not _pair(doc["wall"])
        or not _int(doc["turns"])
        or not _int(doc["tools_other"])
        or not _int(doc["actions_other"])
        or not isinstance(counts, dict)
        or set(counts) != set(_COUNT_KINDS)
        or not all(_int(counts[k]) for k in _COUNT_KINDS)
    ):
        raise RecordInvalid("invalid_summary", "summary shape")
    texts = [("summary text", doc["text"])]
    for list_name in ("tools", "actions"):
        texts.extend((f"summary {list_name} name", n) for n in _names(doc[list_name]))
    _check_texts(texts)
    from_untrusted = counts["avatar"] + counts["tool"] + counts["action"] > 0
    if from_untrusted and doc["untrusted"] is not True:
        raise RecordInvalid(
            "invalid_summary", "summary of avatar/tool/action turns marked untrusted=false"
        )
    return texts


def check_fields_for_append(kind: str, fields: Mapping[str, str], turn_id: str) -> None:
    """The live path's call: a :class:`ValidationError` (``invalid_input``) on refusal."""
    try:
        check_record(kind, dict(fields), turn_id)
    except RecordInvalid as exc:
        raise ValidationError(
            f"this {kind} turn cannot be stored: {exc.detail}"
            " (after redaction and control-character removal)",
            field=kind,
        ) from None


def check_turn_id_for_append(turn_id: str) -> None:
    """A caller's turn id is stored as given: it must not look like a secret.

    Such an id would sit in Redis unredacted, and the snapshot validator (which checks
    every turn id for secrets) would leave its session out of every flush.
    """
    if contains_secret(turn_id):
        raise ValidationError(
            "turn_id looks like a secret (an access key or token); use an opaque request id",
            field="turn_id",
        )
