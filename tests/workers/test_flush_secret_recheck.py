"""The flush's secret re-check: skipped only for records of the current redactor.

A record whose flags name :data:`~memtier.redaction.REDACTOR_VERSION` was redacted by
this very redactor when it was appended (whose output never matches a pattern), so the
flush does not scan its texts again.  Every other record -- the first format (no
version: written before the version existed, or by a restore) or another version -- is
scanned as before, and a session holding a secret in one is left out (``skipped``,
reason ``secret``), never written.  Recovery scans every text of every line whatever
the flush did: a line it wrote unscanned is still never restored if it held a secret.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from workhelpers import Clock, key, persistent_store, snaps

from memtier import AvatarMessage
from memtier.memory.snapshot import validation
from memtier.memory.snapshot.validation import (
    Rejection,
    SnapshotValidationError,
    check_session_line,
    verify_generation,
)
from memtier.memory.turncodec import StoredTurn
from memtier.redaction import REDACTOR_VERSION, contains_secret

GITHUB_TOKEN = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
SECRET_TEXT = f"my token is {GITHUB_TOKEN}"


def _store_with_planted_secret(
    backend: Any, tmp_path: Path, version: int | None
) -> tuple[Any, list[str]]:
    """Three sessions; the first record of session 1 is rewritten in Redis to hold a
    token (same byte count, so only the secret check can refuse it), in the record
    format of ``version`` (None: the first format)."""
    assert contains_secret(SECRET_TEXT)
    store = persistent_store(backend, tmp_path, Clock())
    for n in (1, 2, 3):
        store.append(key(n), AvatarMessage(text="x" * len(SECRET_TEXT), turn_id=f"t{n}"))
        store.append(key(n), AvatarMessage(text=f"second turn of {n}"))
    turns = store.core.partition_for(key(1)).session(key(1).member).turns
    record = StoredTurn.parse(store.client.lindex(turns, 0))
    assert record.redactor_version == REDACTOR_VERSION  # what append writes
    planted = dataclasses.replace(
        record, fields={"text": SECRET_TEXT}, redactor_version=version, rotated=False
    )
    store.client.lset(turns, 0, planted.encode())
    scanned: list[str] = []
    return store, scanned


def _spy(monkeypatch: pytest.MonkeyPatch, scanned: list[str]) -> None:
    def spy(text: str) -> bool:
        scanned.append(text)
        return contains_secret(text)

    monkeypatch.setattr(validation, "contains_secret", spy)


@pytest.mark.parametrize("version", [None, REDACTOR_VERSION + 1], ids=["first-format", "other"])
def test_a_record_not_of_the_current_redactor_is_still_checked(
    backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, version: int | None
) -> None:
    store, scanned = _store_with_planted_secret(backend, tmp_path, version)
    _spy(monkeypatch, scanned)
    try:
        result = store.flush()
    finally:
        store.close()
    assert result.skipped == {"secret": 1}
    assert result.sessions == 2
    assert any(GITHUB_TOKEN in t for t in scanned)  # it was scanned, and caught
    data = Path(result.path).read_bytes()
    assert GITHUB_TOKEN.encode() not in data  # never written
    assert key(1).member.encode() not in data


def test_a_current_redactor_record_is_not_scanned_again(
    backend: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The planted record claims the current redactor: the flush trusts its flags (it
    does not scan it), and recovery, which scans everything, refuses the generation."""
    store, scanned = _store_with_planted_secret(backend, tmp_path, REDACTOR_VERSION)
    _spy(monkeypatch, scanned)
    try:
        result = store.flush()
        assert result.skipped == {} and result.sessions == 3
        assert not any(GITHUB_TOKEN in t for t in scanned)
        assert not any("second turn of" in t for t in scanned)  # no record text at all
        monkeypatch.undo()
        (gen,) = snaps(store).generations()
        verdict = verify_generation(
            gen, store.config.namespace, store.core.conv, snaps(store).max_bytes
        )
    finally:
        store.close()
    assert isinstance(verdict, Rejection) and verdict.reason == "secret", verdict


# --------------------------------------------------------------------------- the line check


def _line(text: str, turn_id: str = "t1", summary: str | None = None) -> dict[str, Any]:
    t0 = 1_800_000_000_000
    nbytes = len(text.encode())
    summary_bytes = len(summary.encode()) if summary is not None else 0
    return {
        "member": "00000000-0000-4000-8000-000000000001:public",
        "id": "ses_" + "A" * 22,
        "created_ms": t0,
        "created_wall_ms": t0,
        "last_ms": t0 + 5,
        "last_wall_ms": t0 + 5,
        "age_ms": 0,
        "read_wall_ms": t0 + 9,
        "seq": 1,
        "turns": 1,
        "bytes": nbytes + summary_bytes,
        "tools": 0,
        "summary_bytes": summary_bytes,
        "summary_version": 1 if summary is not None else 0,
        "summary": summary,
        "records": [
            {
                "seq": 1,
                "clock_ms": t0 + 1,
                "wall_ms": t0 + 1,
                "bytes": nbytes,
                "tool": 0,
                "kind": "avatar",
                "role": "avatar",
                "id": turn_id,
                "f": {"text": text},
            }
        ],
        "receipts": [[turn_id, f"ses_{'A' * 22}|1|{t0 + 1}|{t0 + 1}|{nbytes}|0"]],
    }


def _reason(line: dict[str, Any], redacted: tuple[bool, ...]) -> str | None:
    try:
        check_session_line(line, redacted=redacted)
    except SnapshotValidationError as exc:
        return exc.reason
    return None


def test_the_line_check_skips_only_the_records_it_is_told() -> None:
    line = _line(SECRET_TEXT)
    assert _reason(line, ()) == "secret"  # recovery's call: everything scanned
    assert _reason(line, (False,)) == "secret"
    assert _reason(line, (True,)) is None
    # every other check still runs on a skipped record
    bad = _line(SECRET_TEXT)
    bad["records"][0]["bytes"] += 1
    bad["bytes"] += 1
    assert _reason(bad, (True,)) == "invalid_record"
    with pytest.raises(ValueError, match="every record"):
        check_session_line(_line("hi"), redacted=(True, True))


def test_summaries_and_other_receipts_are_scanned_whatever_the_records() -> None:
    summary = '{"untrusted":true,"text":"' + SECRET_TEXT + '"}'
    assert _reason(_line("hi", summary=summary), (True,)) == "secret"
    line = _line("hi")
    # a receipt of a folded turn (no record of it in the line) whose id is a secret
    line["receipts"].append([GITHUB_TOKEN, line["receipts"][0][1]])
    assert _reason(line, (True,)) == "secret"
