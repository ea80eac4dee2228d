"""Declared script inputs: each Lua script's KEYS (by role) and ARGV (by name), once.

A :class:`ScriptSpec` names a script's KEYS and ARGV in the order the script reads
them; callers build a :class:`~memtier.engine.ScriptCall` by name
(``SPEC.call(keys, turn_id=..., payload=...)``), never by position.  The script's
header is the other half of the contract: its ``KEYS[i] <role>`` and ``ARGV[i] <name>``
lines must match the declaration, which :func:`header_inputs` reads and the contract
tests compare (tests/test_script_specs.py).

Header grammar (inside the leading ``--[[ ... ]]`` comment)::

    KEYS[1] session_hash   free text ...
    ARGV[3] turn_id        free text ...

one line per input, the role/name an identifier (``[a-z][a-z0-9_]*``).  Continuation
lines of the free text do not start with ``KEYS[`` / ``ARGV[``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from memtier.engine import ScriptCall
from memtier.resppack import FREE, WirePlan, tuple_getter

if TYPE_CHECKING:
    from memtier.scripts import Durable

__all__ = ["BoundSpec", "ScriptSpec", "header_inputs"]

_TupleGetter = Callable[[Mapping[str, Any]], tuple[Any, ...]]
_INPUT_LINE = re.compile(r"^\s*(KEYS|ARGV)\[(\d+)\]\s+([A-Za-z_][A-Za-z0-9_]*)")
_IDENTIFIER = re.compile(r"^[a-z][a-z0-9_]*\Z")


@dataclass(frozen=True)
class ScriptSpec:
    """One script's declared inputs: ``keys`` roles and ``argv`` names, in order."""

    script: str
    keys: tuple[str, ...]
    argv: tuple[str, ...]
    # Derived in __post_init__: what checks and orders a mapping of names in C.
    _argv_index: dict[str, int] = field(init=False, repr=False, compare=False)
    _key_set: frozenset[str] = field(init=False, repr=False, compare=False)
    _argv_set: frozenset[str] = field(init=False, repr=False, compare=False)
    _key_getter: _TupleGetter = field(init=False, repr=False, compare=False)
    _argv_getter: _TupleGetter = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in (*self.keys, *self.argv):
            if not _IDENTIFIER.match(name):
                raise ValueError(f"{self.script}: {name!r} is not an identifier")
        if len(set(self.keys)) != len(self.keys) or len(set(self.argv)) != len(self.argv):
            raise ValueError(f"{self.script}: a KEYS role or ARGV name is declared twice")
        # The position of each name, computed once (the hot path builds calls by name).
        object.__setattr__(self, "_argv_index", {n: i for i, n in enumerate(self.argv)})
        object.__setattr__(self, "_key_set", frozenset(self.keys))
        object.__setattr__(self, "_argv_set", frozenset(self.argv))
        object.__setattr__(self, "_key_getter", tuple_getter(self.keys))
        object.__setattr__(self, "_argv_getter", tuple_getter(self.argv))

    def call(
        self, keys: Mapping[str, str] | tuple[str, ...], /, **argv: str | int | bytes
    ) -> ScriptCall:
        """A call with ``keys`` (by role, or a tuple already in KEYS order) and ``argv`` by
        name; every declared name must be given, and no other."""
        return ScriptCall(self.script, self.key_tuple(keys), self.arg_tuple(argv))

    def key_tuple(self, keys: Mapping[str, str] | tuple[str, ...]) -> tuple[str, ...]:
        if isinstance(keys, tuple):
            if len(keys) != len(self.keys):
                raise TypeError(f"{self.script} takes {len(self.keys)} keys, got {len(keys)}")
            return keys
        if keys.keys() != self._key_set:
            raise TypeError(
                f"{self.script} keys: missing {sorted(set(self.keys) - keys.keys())},"
                f" unknown {sorted(keys.keys() - set(self.keys))}"
            )
        return self._key_getter(keys)

    def arg_tuple(self, argv: Mapping[str, str | int | bytes]) -> tuple[str | int | bytes, ...]:
        if argv.keys() != self._argv_set:
            raise TypeError(
                f"{self.script} ARGV: missing {sorted(set(self.argv) - argv.keys())},"
                f" unknown {sorted(argv.keys() - set(self.argv))}"
            )
        return self._argv_getter(argv)

    def bind(self, keys: Mapping[str, str], argv: Mapping[str, str | int | bytes]) -> BoundSpec:
        """A :class:`BoundSpec`: this script's calls with ``keys`` and ``argv`` (the part
        that is the same call after call) given now, checked once; each call then gives
        the rest, by position, as :meth:`BoundSpec.names` lists them."""
        return BoundSpec(self, keys, argv)

    def call_with_tail(
        self,
        keys: Mapping[str, str] | tuple[str, ...],
        tail: Iterable[str | int | bytes],
        /,
        **argv: str | int | bytes,
    ) -> ScriptCall:
        """:meth:`call`, then a counted tail after the declared ARGV (``snapshot_page``'s
        members, ``restore_session``'s records): the script's header documents it."""
        return ScriptCall(self.script, self.key_tuple(keys), (*self.arg_tuple(argv), *tail))

    def replace(self, call: ScriptCall, /, **argv: str | int | bytes) -> ScriptCall:
        """``call`` (a call of this script) with the ARGV named in ``argv`` changed."""
        args = list(call.args)
        for name, value in argv.items():
            args[self.index(name)] = value
        # (a new call without a bound call's wire plan: its fixed values are changed)
        return ScriptCall(call.script, call.keys, tuple(args), call.attempts, call.durable)

    def index(self, name: str) -> int:
        """The 0-based ARGV position of ``name`` (for readers of a built call's args)."""
        return self._argv_index[name]

    def arg(self, call: ScriptCall, name: str) -> Any:
        """The value of ARGV ``name`` in ``call`` (a call of this script)."""
        return call.args[self.index(name)]


class BoundSpec:
    """A script's calls with part of their inputs fixed (``append_turn``'s partition
    keys and limits: the same for every append to one partition and channel).  The hot
    path fills in the rest by position -- no mapping built, no names compared per call;
    the names were checked when it was bound."""

    __slots__ = ("_argv", "_keys", "_pick_argv", "_pick_keys", "_wire", "names", "spec")

    def __init__(
        self, spec: ScriptSpec, keys: Mapping[str, str], argv: Mapping[str, str | int | bytes]
    ) -> None:
        unknown = (keys.keys() - spec._key_set) | (argv.keys() - spec._argv_set)
        if unknown:
            raise TypeError(f"{spec.script}: unknown inputs {sorted(unknown)}")
        self.spec = spec
        # The fixed values, then (per call) the free ones: each call's KEYS and ARGV are
        # picked from ``fixed + free`` by position, in one C call (operator.itemgetter).
        self._keys = tuple(keys[role] for role in spec.keys if role in keys)
        self._argv = tuple(argv[name] for name in spec.argv if name in argv)
        # What each call gives, in this order: the free KEYS roles, then the free ARGV.
        self.names: tuple[tuple[str, ...], tuple[str, ...]] = (
            tuple(role for role in spec.keys if role not in keys),
            tuple(name for name in spec.argv if name not in argv),
        )
        self._pick_keys = _picker(spec.keys, keys.keys(), self.names[0])
        self._pick_argv = _picker(spec.argv, argv.keys(), self.names[1])
        # The packed form's plan: the fixed runs packed once (memtier.resppack).
        layout = [keys.get(r, FREE) for r in spec.keys] + [argv.get(n, FREE) for n in spec.argv]
        wire = WirePlan(len(spec.keys), layout)
        self._wire = wire if wire.usable else None

    def call(
        self,
        keys: tuple[str, ...],
        argv: tuple[str | int | bytes, ...],
        durable: Durable | None = None,
    ) -> ScriptCall:
        """The call with the free KEYS ``keys`` and the free ARGV ``argv``, in
        :attr:`names` order."""
        names = self.names
        if len(keys) != len(names[0]) or len(argv) != len(names[1]):
            raise TypeError(f"{self.spec.script}: a bound call takes {names}")
        return ScriptCall(
            self.spec.script,
            self._pick_keys(self._keys + keys),
            self._pick_argv(self._argv + argv),
            durable=durable,
            wire=self._wire,
        )

    def call_with_tail(
        self,
        keys: tuple[str, ...],
        argv: tuple[str | int | bytes, ...],
        tail: Iterable[str | int | bytes],
    ) -> ScriptCall:
        """:meth:`call`, then a counted tail after the declared ARGV (as
        :meth:`ScriptSpec.call_with_tail`; the wire plan packs it as one more free run)."""
        call = self.call(keys, argv)
        return ScriptCall(call.script, call.keys, (*call.args, *tail), wire=call.wire)


def _picker(
    order: tuple[str, ...], fixed: Iterable[str], free: tuple[str, ...]
) -> Callable[[tuple[Any, ...]], tuple[Any, ...]]:
    """``values -> tuple`` in ``order``, where ``values`` holds the ``fixed`` names' values
    (in ``order``'s order) followed by the ``free`` names' values."""
    fixed_set = set(fixed)
    fixed_names = [name for name in order if name in fixed_set]
    position = {name: i for i, name in enumerate([*fixed_names, *free])}
    return tuple_getter(tuple(position[name] for name in order))


def header_inputs(source: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(KEYS roles, ARGV names) as a script's header declares them, in order.

    Raises ValueError when the numbering has a gap or a repeat (a header that cannot
    be matched against a declaration is itself a defect).
    """
    header = source.split("]]", 1)[0]
    found: dict[str, dict[int, str]] = {"KEYS": {}, "ARGV": {}}
    for line in header.splitlines():
        match = _INPUT_LINE.match(line)
        if match is None:
            continue
        kind, index, name = match.group(1), int(match.group(2)), match.group(3)
        if index in found[kind]:
            raise ValueError(f"{kind}[{index}] is declared twice in the header")
        found[kind][index] = name
    result: list[tuple[str, ...]] = []
    for kind in ("KEYS", "ARGV"):
        indexes = sorted(found[kind])
        if indexes != list(range(1, len(indexes) + 1)):
            raise ValueError(f"{kind} numbering in the header is not 1..n: {indexes}")
        result.append(tuple(found[kind][i] for i in indexes))
    return result[0], result[1]
