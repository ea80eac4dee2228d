"""Progress of long operator commands (``memtier flush``, ``restore``, ``inspect``).

On a terminal: one line redrawn in place -- sessions done of total, bytes, rate and
time left.  When stderr is not a TTY (a log file, a pipe, a cron mail): a plain line
every :data:`PLAIN_INTERVAL_S` seconds (``MEMTIER_PROGRESS_INTERVAL_S`` overrides both
intervals) and one at the end.  Always on stderr, so
the JSON on stdout stays clean; never any conversation content.

:meth:`Progress.observe` reads the replies of the memory scripts the command runs
(hooked in as the store's ``on_script``), so the flush and recovery code need not
know about it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Final, TextIO

__all__ = ["PLAIN_INTERVAL_S", "TTY_INTERVAL_S", "Progress", "human_bytes"]

TTY_INTERVAL_S: Final = 0.2
PLAIN_INTERVAL_S: Final = 5.0
INTERVAL_ENV: Final = "MEMTIER_PROGRESS_INTERVAL_S"
MIN_INTERVAL_S: Final = 0.05  # a floor: progress never costs more than the work


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _duration(seconds: float) -> str:
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class Progress:
    """Sessions done of ``total`` (None: unknown), bytes, rate, ETA; see the module doc."""

    def __init__(
        self,
        what: str,
        total: int | None,
        *,
        stream: TextIO | None = None,
        interval_s: float | None = None,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what = what
        self.total = total
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(self.stream.isatty()) if tty is None else tty
        if interval_s is None:
            interval_s = TTY_INTERVAL_S if self.tty else PLAIN_INTERVAL_S
            try:
                interval_s = float(os.environ.get(INTERVAL_ENV, interval_s))
            except ValueError:
                pass
        self.interval_s = max(MIN_INTERVAL_S, interval_s)
        self.clock = clock
        self.started = clock()
        self.sessions = 0
        self.bytes = 0
        self.lines = 0  # plain lines or redraws written
        self._last_shown = self.started
        self._finished = False

    # --- feeding -----------------------------------------------------------------------------
    def advance(self, sessions: int = 0, nbytes: int = 0) -> None:
        self.sessions += sessions
        self.bytes += nbytes
        now = self.clock()
        if now - self._last_shown >= self.interval_s:
            self._last_shown = now
            self._show(now)

    def observe(self, script: str, args: Sequence[Any], reply: Any) -> None:
        """A store's ``on_script`` hook: count what flush/restore/inspect scripts return."""
        try:
            if script == "snapshot_page":  # {clock, wall, n, (member, fields..., records...)*n}
                nbytes = sum(len(x) for x in reply[3:] if isinstance(x, bytes | str))
                self.advance(int(reply[2]), nbytes)
            elif script == "restore_session":  # {0, bytes, last} restored; others: skipped
                self.advance(1, int(reply[1]) if int(reply[0]) == 0 else 0)
        except (IndexError, TypeError, ValueError):
            return

    # --- output ------------------------------------------------------------------------------
    def line(self, now: float | None = None) -> str:
        now = self.clock() if now is None else now
        elapsed = max(now - self.started, 1e-9)
        rate = self.sessions / elapsed
        if self.total:
            percent = 100 * self.sessions / self.total
            done = f"{self.sessions}/{self.total} sessions ({percent:.0f}%)"
            left = max(self.total - self.sessions, 0)
            eta = _duration(left / rate) if rate > 0 else "?"
            tail = f", ETA {eta}"
        else:
            done, tail = f"{self.sessions} sessions", ""
        return (
            f"memtier {self.what}: {done}, {human_bytes(self.bytes)}, {rate:.0f} sessions/s,"
            f" {_duration(elapsed)} elapsed{tail}"
        )

    def _show(self, now: float) -> None:
        self.lines += 1
        if self.tty:
            self.stream.write("\r" + self.line(now) + "\x1b[K")
        else:
            self.stream.write(self.line(now) + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self._finished:
            return
        self._finished = True
        self._show(self.clock())
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
