"""Ledger checking (Jepsen's method) for conversation-memory appends under faults.

Writers (:mod:`ledger_writer`, separate processes, so a kill hits them where it
would hit production) append turns with their own turn ids and record every
attempt and its outcome in a JSON-lines ledger:

* ``ack``     -- ``append`` returned a receipt (session id, seq);
* ``failed``  -- a memtier error whose code says the write was *not applied*
  (a refusal: OOM, MISCONF, ACL, a bound);
* ``unknown`` -- any other memtier error (the write may or may not have happened);
* ``crash``   -- an exception that is not a memtier error: always a defect.

An attempt with no outcome line (the writer was killed mid-call) is unknown.

After the fault and a settle period, :func:`settle_unknowns` retries every
unknown turn with the same id, and :func:`judge` compares the ledger with what
Redis holds:

* every acknowledged turn is present exactly once, at the receipt's (session, seq);
* a turn reported as not applied is absent;
* an unknown turn, retried with the same id, is present exactly once;
* sequences are gapless and match the session's counters;
* session and partition byte totals equal the sum of the stored records.

Every turn's text carries its turn id (``ledger <w3-17>``), so the judge reads
stored records without relying on the record's internal id field.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtier import AvatarMessage, ConversationKey, ConversationStore, MemtierError
from memtier.keys import MemoryKeyspace
from memtier.memory.state import StoredTurn

__all__ = [
    "NOT_APPLIED_CODES",
    "Attempt",
    "Verdict",
    "judge",
    "ledger_key",
    "read_ledgers",
    "settle_unknowns",
    "start_writers",
    "turn_text",
    "wait_writers",
]

REPO = Path(__file__).resolve().parents[2]
WRITER = Path(__file__).with_name("ledger_writer.py")

# Codes whose contract is "nothing was written" (the refusal happened before any effect).
NOT_APPLIED_CODES = frozenset(
    {
        "backend_refused",
        "backend_busy",  # no connection came free: nothing was sent
        "backend_unavailable",  # no attempt could have reached Redis (memtier.retry)
        "invalid_request",  # (spelt invalid_input before issue 13)
        "unsupported_channel",
        "turn_too_large",
        "capacity_exceeded",
        "session_full",
        "configuration_error",
    }
)

_TURN_ID_RE = re.compile(r"ledger <(?P<id>w\d+-\d+)>")


def ledger_key(index: int, channel: str = "im") -> ConversationKey:
    """The keys every writer shares (several writers per key: real contention)."""
    return ConversationKey(uuid.UUID(int=0xFA000 + index), channel)


def turn_text(turn_id: str) -> str:
    return f"ledger <{turn_id}> payload {'x' * 40}"


def classify(exc: BaseException) -> tuple[str, str]:
    """``(outcome, code)`` of a failed attempt."""
    if isinstance(exc, MemtierError):
        code = str(exc.code)
        return ("failed" if code in NOT_APPLIED_CODES else "unknown"), code
    return "crash", f"{type(exc).__name__}: {exc}"


@dataclass
class Attempt:
    turn_id: str
    member: str
    outcome: str = "unknown"  # until an outcome line says otherwise
    code: str = ""
    session_id: str = ""
    seq: int = 0


def read_ledgers(paths: Iterable[Path]) -> dict[str, Attempt]:
    attempts: dict[str, Attempt] = {}
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.endswith("}"):
                continue  # a line cut by a kill: its attempt stays unknown
            row = json.loads(line)
            tid = row["t"]
            if row["s"] == "attempt":
                attempts[tid] = Attempt(tid, row["m"])
                continue
            found = attempts[tid]
            found.outcome = row["s"]
            found.code = row.get("code", "")
            found.session_id = row.get("sid", "")
            found.seq = int(row.get("seq", 0))
    return attempts


@dataclass
class Writers:
    """The writer processes of one row; leaving the ``with`` block kills any still running."""

    procs: list[subprocess.Popen[bytes]]
    ledgers: list[Path]
    logs: list[Path]

    def __enter__(self) -> Writers:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.procs:  # only our own children
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def start_writers(
    url: str,
    namespace: str,
    workdir: Path,
    *,
    writers: int = 3,
    keys: int = 12,  # ~60 turns a key: below every session bound (no compaction)
    turns: int = 400,
    seconds: float = 30.0,
    pause_ms: int = 0,
    extra: Sequence[str] = (),
    together: bool = False,
) -> Writers:
    """Start ``writers`` processes appending ``turns`` each (bounded also by ``seconds``).

    ``together``: every writer connects first and they start appending at once (for a
    fault that the writes themselves cause, such as a disk filling up: a writer that
    started late would only ever see it)."""
    procs, ledgers, logs = [], [], []
    go = workdir / "go"
    if together:
        extra = (*extra, "--go", str(go))
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    for w in range(writers):
        ledger = workdir / f"ledger-{w}.jsonl"
        log = workdir / f"writer-{w}.log"
        command = [
            sys.executable,
            str(WRITER),
            "--url", url,
            "--namespace", namespace,
            "--writer", str(w),
            "--keys", str(keys),
            "--turns", str(turns),
            "--seconds", str(seconds),
            "--pause-ms", str(pause_ms),
            "--ledger", str(ledger),
            *extra,
        ]  # fmt: skip
        with log.open("wb") as out:
            procs.append(
                subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env)
            )
        ledgers.append(ledger)
        logs.append(log)
    started = Writers(procs, ledgers, logs)
    if together:
        deadline = time.monotonic() + 60.0
        ready = [workdir / f"go.ready-{w}" for w in range(writers)]
        while not all(r.exists() for r in ready):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                started.__exit__()
                raise AssertionError(f"the writers did not connect: {[r.exists() for r in ready]}")
            time.sleep(0.01)
        go.touch()
    return started


def wait_writers(writers: Writers, timeout_s: float = 180.0) -> None:
    """Wait for every writer; one still running after ``timeout_s`` is killed (we own it)."""
    for proc, log in zip(writers.procs, writers.logs, strict=True):
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            proc.wait()
            tail = log.read_text()[-2000:]
            raise AssertionError(f"writer {proc.pid} did not finish: {tail}") from exc
        if proc.returncode != 0:
            raise AssertionError(
                f"writer exited {proc.returncode}: {log.read_text(errors='replace')[-2000:]}"
            )


def settle_unknowns(store: ConversationStore, attempts: dict[str, Attempt]) -> int:
    """Retry every unknown turn with its own turn id (what a careful caller does)."""
    retried = 0
    for attempt in attempts.values():
        if attempt.outcome != "unknown":
            continue
        avatar, channel = attempt.member.split(":")
        receipt = store.append(
            ConversationKey(uuid.UUID(avatar), channel),
            AvatarMessage(text=turn_text(attempt.turn_id), turn_id=attempt.turn_id),
        )
        attempt.outcome = "retried"
        attempt.session_id, attempt.seq = receipt.session_id, receipt.seq
        retried += 1
    return retried


@dataclass
class Verdict:
    attempts: int = 0
    acknowledged: int = 0
    failed: int = 0
    retried: int = 0
    stored: int = 0
    lost_unreplicated: int = 0  # acknowledged, then lost with a primary (lossy rows only)
    violations: list[str] = field(default_factory=list)

    def check(self) -> None:
        assert not self.violations, "\n".join(self.violations[:40])
        assert self.acknowledged > 0, f"the workload acknowledged nothing: {self}"


def _s(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def judge(
    client: Any,
    namespace: str,
    attempts: dict[str, Attempt],
    *,
    may_be_lost: frozenset[str] = frozenset(),
    unreplicated_loss_allowed: bool = False,
) -> Verdict:
    """Compare the ledger with Redis (a standalone client, or a cluster client).

    ``may_be_lost``: turn ids whose absence is expected (a row that cuts the log).
    ``unreplicated_loss_allowed``: an acknowledged turn may be absent after a primary
    was lost (asynchronous replication); such turns are counted in
    :attr:`Verdict.lost_unreplicated` instead of failing, every other rule holds.
    """
    verdict = Verdict(attempts=len(attempts))
    violations = verdict.violations
    by_outcome = Counter(a.outcome for a in attempts.values())
    verdict.acknowledged = by_outcome["ack"]
    verdict.failed = by_outcome["failed"]
    verdict.retried = by_outcome["retried"]
    for attempt in attempts.values():
        if attempt.outcome == "crash":
            violations.append(f"{attempt.turn_id}: untyped error escaped: {attempt.code}")
        elif attempt.outcome == "unknown":
            violations.append(f"{attempt.turn_id}: unknown outcome was never settled")
    keyspace = MemoryKeyspace(namespace)
    part = keyspace.partition(0)
    members = sorted({a.member for a in attempts.values()})
    found: dict[str, list[tuple[str, str, int]]] = defaultdict(list)  # tid -> (member, sid, seq)
    partition_total = 0
    index = {_s(k): int(v) for k, v in client.hgetall(part.index).items()}
    for member in members:
        keys = part.session(member)
        session = {_s(k): _s(v) for k, v in client.hgetall(keys.session).items()}
        records = [StoredTurn.parse(raw) for raw in client.lrange(keys.turns, 0, -1)]
        if not session:
            if records:
                violations.append(f"{member}: {len(records)} turns but no session hash")
            continue
        sid = session.get("id", "")
        seqs = [r.seq for r in records]
        if seqs and seqs != list(range(seqs[0], seqs[0] + len(seqs))):
            violations.append(f"{member}: sequence has gaps or disorder: {seqs[:50]}")
        if seqs and str(seqs[-1]) != session.get("seq"):
            violations.append(f"{member}: last seq {seqs[-1]} != session seq {session.get('seq')}")
        if str(len(records)) != session.get("turns"):
            violations.append(
                f"{member}: {len(records)} records, session says {session.get('turns')}"
            )
        for record in records:
            if record.nbytes != record.content_bytes:
                violations.append(f"{member} seq {record.seq}: bytes field != content bytes")
            text = record.fields.get("text", "")
            match = _TURN_ID_RE.search(text)
            if match:
                found[match.group("id")].append((member, sid, record.seq))
        summary_bytes = int(session.get("summary_bytes", "0") or 0)
        session_total = sum(r.nbytes for r in records) + summary_bytes
        if str(session_total) != session.get("bytes"):
            violations.append(
                f"{member}: records+summary = {session_total} B,"
                f" session says {session.get('bytes')}"
            )
        if index.get(member) != session_total:
            violations.append(
                f"{member}: index says {index.get(member)} B, records {session_total}"
            )
        partition_total += session_total
        verdict.stored += len(records)
    meta_bytes = int(_s(client.hget(part.meta, "bytes") or b"0"))
    if meta_bytes != sum(index.values()):
        violations.append(
            f"partition meta bytes {meta_bytes} != sum of index {sum(index.values())}"
        )
    if sum(index.values()) != partition_total:
        violations.append(f"index total {sum(index.values())} != stored records {partition_total}")
    for tid, places in found.items():
        if len(places) > 1:
            violations.append(f"{tid}: stored {len(places)} times: {places}")
        if tid not in attempts:
            violations.append(f"{tid}: stored but never attempted")
    for attempt in attempts.values():
        places = found.get(attempt.turn_id, [])
        if attempt.outcome in ("ack", "retried"):
            if not places:
                if unreplicated_loss_allowed and attempt.outcome == "ack":
                    verdict.lost_unreplicated += 1
                elif attempt.turn_id not in may_be_lost:
                    violations.append(f"{attempt.turn_id}: {attempt.outcome} but absent")
                continue
            member, sid, seq = places[0]
            if (sid, seq) != (attempt.session_id, attempt.seq):
                violations.append(
                    f"{attempt.turn_id}: receipt ({attempt.session_id}, {attempt.seq})"
                    f" but stored at ({sid}, {seq})"
                )
        elif attempt.outcome == "failed" and places:
            violations.append(
                f"{attempt.turn_id}: reported not applied ({attempt.code}) but stored"
            )
    return verdict
