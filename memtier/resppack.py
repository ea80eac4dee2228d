"""The wire bytes of a bound script call: the runs that repeat packed once, when bound.

hiredis packs a command in C, but formats each argument's ``$<length>`` header with
``sprintf``: 36 calls per ``append_turn`` call (34 arguments), about 9 % of a sync
append's client instructions (``python -m bench.icount`` under callgrind;
docs/performance.md, twenty-fifth round).  Most of those arguments are the same call
after call -- the partition's keys and limits a :class:`~memtier.scriptspec.BoundSpec`
fixes.  A :class:`WirePlan` packs each run of fixed arguments once, when the spec is
bound, and per call packs only the runs of free ones (hiredis again, their ``*<n>``
header cut off), then joins the pieces under the command's own header.

The bytes are exactly ``hiredis.pack_command`` of the whole ``EVALSHA`` (what the lean
paths send otherwise), so the two are interchangeable per call; tests/test_resppack.py
holds the plan to that on generated layouts and values.  The plan is used only where the
lean path would pack with hiredis (UTF-8, strict: ``packs_utf8`` of the pool or packer);
anything else packs the whole call as before.  Free values must be ``str``, ``int`` or
``bytes`` (what hiredis packs as redis-py's encoder does); hiredis refuses the rest
(``bool`` included) with ``TypeError``, as it does for a whole call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Any, Final

_pack: Any
try:  # hiredis packs in C: the lean paths' packer
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis])
    _pack = None

__all__ = ["FREE", "HIREDIS_PACK", "WirePlan", "packs_alike", "tuple_getter"]

# hiredis's packer of a whole command (None without hiredis): every lean path packs with
# it where packs_alike() holds, else with the connection's own encoder.
HIREDIS_PACK: Final[Callable[[tuple[Any, ...]], bytes] | None] = _pack

# Marks a free argument in a layout (any other value is that fixed argument).
FREE: Final = object()
# What hiredis packs exactly as redis-py's encoder does (UTF-8, strict): a fixed value of
# another type leaves the plan unused.
_PLAIN: Final = frozenset({str, bytes, int})


def packs_alike(encoding: object, errors: object) -> bool:
    """hiredis packs ``str`` arguments as redis-py's encoder with ``encoding`` and
    ``errors`` does: UTF-8, strict (and hiredis is installed)."""
    utf8 = str(encoding).lower().replace("_", "-") in ("utf-8", "utf8")
    return _pack is not None and utf8 and errors == "strict"


def tuple_getter(keys: tuple[Any, ...]) -> Callable[[Any], tuple[Any, ...]]:
    """``container -> tuple(container[k] for k in keys)`` (names of a mapping, or
    positions of a tuple), as one C call where it can be.  (Also what
    :mod:`memtier.scriptspec` picks a call's KEYS and ARGV with.)"""
    if len(keys) >= 2:
        return itemgetter(*keys)  # a tuple for two keys or more
    if len(keys) == 1:
        only = keys[0]
        return lambda container: (container[only],)
    return lambda container: ()


def _header_size(count: int) -> int:
    return len(b"*%d\r\n" % count)


class WirePlan:
    """The packed ``EVALSHA`` of one script's calls, its fixed runs packed once.

    ``layout`` is the call's KEYS then ARGV, in order: each a fixed value or :data:`FREE`.
    :meth:`pack` takes a call's whole KEYS + ARGV (the fixed values in their places, as
    the bound spec built them) and packs only the free runs; values past the layout (a
    counted tail: more turns of one session) are one more free run.
    """

    __slots__ = ("_count", "_evalsha", "_fixed", "_fixed_at", "_keys", "_steps", "usable")

    def __init__(self, num_keys: int, layout: Sequence[Any]) -> None:
        self._keys = num_keys
        self._count = len(layout)
        # Fixed values that hiredis would not pack like redis-py: the plan stays unused.
        self.usable = _pack is not None and all(v is FREE or type(v) in _PLAIN for v in layout)
        # Steps, in order: bytes (a fixed run, packed) or (start, stop, header) of a free run.
        steps: list[bytes | tuple[int, int, int]] = []
        start = 0
        while self.usable and start < len(layout):
            free = layout[start] is FREE
            stop = start
            while stop < len(layout) and (layout[stop] is FREE) == free:
                stop += 1
            header = _header_size(stop - start)
            if free:
                steps.append((start, stop, header))
            else:
                steps.append(_pack(tuple(layout[start:stop]))[header:])
            start = stop
        self._steps: tuple[bytes | tuple[int, int, int], ...] = tuple(steps)
        # The fixed values and what picks a call's values at their positions (one C
        # call): a call whose fixed values are not these (built another way, or derived
        # with dataclasses.replace) is not packed by the plan.
        at = tuple(i for i, v in enumerate(layout) if v is not FREE)
        self._fixed = tuple(layout[i] for i in at)
        self._fixed_at = tuple_getter(at)
        self._evalsha: tuple[str, bytes] | None = None  # (sha, its packed run): one script

    def pack(self, sha: str, values: tuple[Any, ...]) -> bytes | None:
        """``hiredis.pack_command(("EVALSHA", sha, num_keys, *values))``, with the fixed
        runs as packed when bound.  ``values`` is a call's KEYS + ARGV: None (pack the
        whole call) unless there are at least as many as the layout and its fixed values
        are the layout's (compared in C; the same objects, as a bound spec builds them)."""
        count = self._count
        if len(values) < count or self._fixed_at(values) != self._fixed:
            return None
        head = self._evalsha
        if head is None or head[0] != sha:
            run = ("EVALSHA", sha, self._keys)
            head = self._evalsha = (sha, _pack(run)[_header_size(3) :])
        pieces = [b"*%d\r\n" % (3 + len(values)), head[1]]
        for step in self._steps:
            if isinstance(step, bytes):
                pieces.append(step)
            else:
                start, stop, header = step
                pieces.append(_pack(values[start:stop])[header:])
        if len(values) > count:  # the counted tail
            pieces.append(_pack(values[count:])[_header_size(len(values) - count) :])
        return b"".join(pieces)
