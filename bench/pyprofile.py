"""pyinstrument helpers of the probes: run a loop under the profiler, save the text tree,
and fold the tree into a flat self-time table and the inclusive time of named functions.

The flat table answers "where do the microseconds go" without reading the tree: every
sample's time is charged once, to the innermost frame (self time), grouped by function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["available", "fold", "fold_collapsed", "profile_loop"]


def available() -> bool:
    try:
        import pyinstrument  # noqa: F401
    except ImportError:
        return False
    return True


def _name(frame: Any) -> str:
    cls = f"{frame.class_name}." if getattr(frame, "class_name", None) else ""
    where = frame.file_path_short or ""
    if "site-packages/" in where:
        where = where.split("site-packages/", 1)[1]
    return f"{cls}{frame.function}  {where}"


def fold(root: Any, named: Iterable[str], per: int) -> dict[str, Any]:
    """``{"total_us", "self": [(name, us per op)], "inclusive": {name: us per op}}``.

    ``named``: function names (``Class.method`` or ``function``) whose inclusive time is
    reported, counted at their outermost occurrence only (no double counting).
    """
    selfs: dict[str, float] = {}
    wanted = set(named)
    inclusive: dict[str, float] = dict.fromkeys(wanted, 0.0)

    def walk(frame: Any, open_names: frozenset[str]) -> None:
        # pyinstrument's synthetic "[self]" children hold their parent's own time.
        children = [c for c in frame.children if not c.is_synthetic]
        own = frame.time - sum(c.time for c in children)
        key = _name(frame)
        selfs[key] = selfs.get(key, 0.0) + own
        short = (f"{frame.class_name}." if frame.class_name else "") + frame.function
        names = open_names
        for candidate in (short, frame.function):
            if candidate in wanted and candidate not in open_names:
                inclusive[candidate] += frame.time
                names = names | {candidate}
                break
        for child in children:
            walk(child, names)

    walk(root, frozenset())
    scale = 1e6 / max(1, per)
    top = sorted(selfs.items(), key=lambda kv: -kv[1])[:30]
    return {
        "total_us": root.time * scale,
        "self": [(k, v * scale) for k, v in top],
        "inclusive": {k: v * scale for k, v in inclusive.items()},
    }


def profile_loop(
    fn: Callable[[], Any], n: int, out: Path, named: Iterable[str], interval: float = 0.0001
) -> dict[str, Any]:
    """Profile ``n`` calls of ``fn``; write the text tree to ``out``; return :func:`fold`."""
    from pyinstrument import Profiler

    profiler = Profiler(interval=interval)
    profiler.start()
    for _ in range(n):
        fn()
    profiler.stop()
    out.write_text(
        profiler.output_text(unicode=False, color=False, show_all=False), encoding="utf-8"
    )
    session = profiler.last_session
    root = None if session is None else session.root_frame()
    if root is None:
        return {"total_us": 0.0, "self": [], "inclusive": {}, "profile_path": str(out)}
    folded = fold(root, named, n)
    folded["profile_path"] = str(out)
    return folded


def _frame_name(frame: str) -> str:
    """``"func (path/file.py:12)"`` -> ``"func  path/file.py"`` (lines merged)."""
    func, _, where = frame.partition(" (")
    where = where.rstrip(")").rsplit(":", 1)[0]
    if "site-packages/" in where:
        where = where.split("site-packages/", 1)[1]
    return f"{func}  {where}"


WAITING_LEAVES = frozenset({"_HiredisParser.read_from_socket", "socket.recv_into", "socket.recv"})


def fold_collapsed(
    path: Path, marker: str, named: Iterable[str], *, rate_hz: float, ops: int
) -> dict[str, Any]:
    """Fold py-spy's ``--format raw`` (collapsed stacks) like :func:`fold`, in us per op.

    Only stacks through a frame whose function is ``marker`` count (the measured loop, not
    start-up).  Samples whose innermost frame reads the socket are the client waiting for
    Redis (py-spy's idle detection does not drop them here); they are reported apart as
    ``waiting_us`` and left out of ``self`` so that ``self`` is the client's own work.
    """
    wanted = set(named)
    selfs: dict[str, int] = {}
    inclusive: dict[str, int] = dict.fromkeys(wanted, 0)
    total = waiting = 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not count_text.isdigit():
            continue
        frames = stack.split(";")
        funcs = [f.partition(" (")[0] for f in frames]
        if marker not in funcs:
            continue
        count = int(count_text)
        total += count
        if funcs[-1] in WAITING_LEAVES:
            waiting += count
            continue
        leaf = _frame_name(frames[-1])
        selfs[leaf] = selfs.get(leaf, 0) + count
        for name in wanted & set(funcs):
            inclusive[name] += count
    scale = 1e6 / rate_hz / max(1, ops)
    top = sorted(selfs.items(), key=lambda kv: -kv[1])[:30]
    return {
        "samples": total,
        "total_us": total * scale,
        "waiting_us": waiting * scale,
        "working_us": (total - waiting) * scale,
        "self": [(k, v * scale) for k, v in top],
        "inclusive_working": {k: v * scale for k, v in inclusive.items()},
    }
