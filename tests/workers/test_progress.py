"""Progress of ``memtier flush`` / ``restore`` / ``inspect`` (memtier.progress).

* Units on a fake clock: the plain (non-TTY) lines come every interval with done of
  total, bytes, rate and ETA; a TTY gets one line redrawn in place.
* 100k sessions on a real Redis, through the CLI: flush, inspect and restore print
  periodic progress lines on stderr ending at 100000/100000, while stdout stays the
  JSON it always was.  Restore runs one create-only script per session (about two
  minutes for 100k on a loaded 2-core box: marked slow, still run in CI); the same
  restore is also driven with the script's own replies on a fake clock (fast).
"""

from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from servers import RedisServer

from memtier.config import MemtierConfig
from memtier.memory.models import AvatarMessage, ConversationKey
from memtier.memory.store import ConversationStore
from memtier.progress import Progress
from memtier.workers.cli import flush_main, inspect_main, restore_main

SESSIONS = 100_000
LINE = re.compile(
    r"^memtier (?P<what>\w+): (?P<done>\d+)(?:/(?P<total>\d+))? sessions(?: \((?P<pct>\d+)%\))?,"
    r" (?P<bytes>[\d.]+ (?:B|KiB|MiB|GiB)), (?P<rate>\d+) sessions/s, [\d:]+ elapsed"
    r"(?:, ETA (?P<eta>[\d:?]+))?$"
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@given(
    pages=st.lists(st.integers(1, 256), min_size=1, max_size=60),
    step_s=st.floats(0.01, 3.0),
)
@example(pages=[256] * 390 + [160], step_s=0.1)  # 100k sessions in snapshot pages
def test_plain_lines_every_interval_with_totals(pages: list[int], step_s: float) -> None:
    total = sum(pages)
    clock = FakeClock()
    out = io.StringIO()
    progress = Progress("flush", total, stream=out, interval_s=1.0, tty=False, clock=clock)
    for n in pages:
        clock.now += step_s
        progress.advance(n, 100 * n)
    progress.finish()
    lines = out.getvalue().splitlines()
    elapsed = step_s * len(pages)
    assert len(lines) >= 1 + int(elapsed // (1.0 + step_s))  # periodic, not only at the end
    assert len(lines) <= 2 + int(elapsed / 1.0)  # never more often than the interval
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    done = [int(m["done"]) for m in parsed if m]
    assert done == sorted(done) and done[-1] == total
    last = parsed[-1]
    assert last is not None and int(last["total"]) == total and last["pct"] == "100"
    assert last["eta"] == "0:00"


def test_tty_redraws_one_line() -> None:
    clock = FakeClock()
    out = io.StringIO()
    progress = Progress("restore", 1000, stream=out, interval_s=0.2, tty=True, clock=clock)
    for _ in range(10):
        clock.now += 0.5
        progress.advance(100, 4096)
    progress.finish()
    text = out.getvalue()
    assert text.count("\r") == 11 and text.endswith("\n") and text.count("\n") == 1
    assert "1000/1000 sessions (100%)" in text and "ETA" in text and "KiB" in text


def test_restore_of_100k_sessions_from_script_replies() -> None:
    clock = FakeClock()
    out = io.StringIO()
    progress = Progress("restore", SESSIONS, stream=out, interval_s=5.0, tty=False, clock=clock)
    for n in range(SESSIONS):
        clock.now += 0.001  # 1 ms per session: 100 s in all
        reply = [0, 300 + n % 7, 1] if n % 10 else [2, 5]  # every tenth one expired
        progress.observe("restore_session", (), reply)
    progress.finish()
    lines = [LINE.match(line) for line in out.getvalue().splitlines()]
    assert all(lines) and 19 <= len(lines) <= 21  # every 5 s of 100 s, plus the last
    done = [int(m["done"]) for m in lines if m]
    assert done == sorted(done) and done[-1] == SESSIONS
    first = lines[0]
    assert first is not None and first["eta"] not in (None, "?", "0:00")


def test_observe_counts_flush_pages_and_restored_sessions() -> None:
    clock = FakeClock()
    progress = Progress("x", None, stream=io.StringIO(), tty=False, clock=clock)
    progress.observe("snapshot_page", (), [1, 2, 3, b"m1", b"abc", b"m2", b"de"])
    progress.observe("restore_session", (), [0, 120, 5])
    progress.observe("restore_session", (), [1])  # live already: a session done, no bytes
    progress.observe("list_metadata", (), [0, []])  # not a progress script
    progress.observe("snapshot_page", (), [1])  # malformed: ignored, never raises
    assert progress.sessions == 3 + 1 + 1 and progress.bytes == 9 + 120  # reply bytes read


# ----------------------------------------------------------------------------- real


def _populate(store: ConversationStore, count: int) -> None:
    """``count`` one-turn sessions, pipelined (the store's own append_turn script)."""
    script = store.scripts["append_turn"]
    store.scripts.load_all(store.client)
    batch = 2000
    for start in range(0, count, batch):
        pipe = store.client.pipeline(transaction=False)
        for n in range(start, min(start + batch, count)):
            key = ConversationKey(f"00000000-0000-4000-8000-{n:012d}", "im")
            prepared = store.core.prepare_turn(key, AvatarMessage(text=f"hello {n}"))
            call = store.core.append_call(prepared)
            pipe.evalsha(script.sha, script.num_keys, *call.keys, *call.args)
        for reply in pipe.execute():
            assert int(reply[0]) == 0, reply


def _progress_lines(err: str, what: str) -> list[re.Match[str]]:
    found = [LINE.match(line) for line in err.splitlines()]
    return [m for m in found if m and m["what"] == what]


@pytest.mark.slow
def test_flush_restore_inspect_of_100k_sessions_show_progress(
    redis_server: RedisServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    namespace = "prog" + os.urandom(4).hex()
    monkeypatch.setenv("MEMTIER_CONVERSATION__PERSISTENCE_ENABLED", "true")
    monkeypatch.setenv("MEMTIER_CONVERSATION__STORAGE_PATH", str(tmp_path))
    monkeypatch.setenv("MEMTIER_PROGRESS_INTERVAL_S", "0.05")
    common = ["--redis-url", redis_server.url, "--namespace", namespace]
    config = MemtierConfig.load(redis_url=redis_server.url, namespace=namespace)
    store = ConversationStore.from_config(config, recover=False)

    def wipe() -> None:
        with redis_server.client() as raw:
            keys = list(raw.scan_iter(match=f"*{namespace}*", count=5000))
            for i in range(0, len(keys), 5000):
                raw.delete(*keys[i : i + 5000])

    try:
        _populate(store, SESSIONS)
        assert store.stats()["sessions"] == SESSIONS
        capsys.readouterr()

        def check(what: str, err: str, total: int = SESSIONS) -> None:
            lines = _progress_lines(err, what)
            assert len(lines) >= 2, err[-2000:]  # periodic lines, then the last one
            assert all(int(m["total"]) == total for m in lines), err[-2000:]
            assert int(lines[-1]["done"]) == total and lines[-1]["pct"] == "100"
            assert lines[-1]["bytes"] != "0 B"

        assert flush_main(common) == 0
        captured = capsys.readouterr()
        assert json.loads(captured.out.splitlines()[-1])["sessions"] == SESSIONS
        check("flush", captured.err)

        assert inspect_main([*common, "sessions", "--limit", str(SESSIONS)]) == 0
        captured = capsys.readouterr()
        assert len(captured.out.splitlines()) == SESSIONS
        check("inspect", captured.err)

        # Restore the 100k-session generation just flushed into an emptied Redis (about
        # two minutes on a loaded two-core box: one create-only script per session).
        wipe()
        assert restore_main(common) == 0
        captured = capsys.readouterr()
        report: dict[str, Any] = json.loads(captured.out.splitlines()[-1])
        assert report["outcome"] == "restored" and report["restored"] == SESSIONS
        check("restore", captured.err, SESSIONS)
    finally:
        wipe()
        store.close()
