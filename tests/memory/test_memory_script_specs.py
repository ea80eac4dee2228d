"""Every memory script's declared inputs (memtier.memory.scriptspecs) match its header."""

from __future__ import annotations

import dataclasses

import pytest

from memtier.memory.scriptspecs import MEMORY_SPECS
from memtier.scripts import load_registry, lua_root
from memtier.scriptspec import ScriptSpec, header_inputs

# Scripts without a spec, and why (see the module docstring of scriptspecs).
WITHOUT_SPEC: set[str] = set()


def _source(name: str) -> str:
    (path,) = (lua_root() / "memory").glob(f"{name}-*.lua")
    return path.read_text(encoding="utf-8")


def _matches(spec: ScriptSpec, source: str) -> bool:
    return (spec.keys, spec.argv) == header_inputs(source)


@pytest.mark.parametrize("name", sorted(MEMORY_SPECS))
def test_spec_equals_header(name: str) -> None:
    spec = MEMORY_SPECS[name]
    assert spec.script == name
    assert header_inputs(_source(name)) == (spec.keys, spec.argv)
    assert len(spec.keys) == load_registry("memory")[name].num_keys  # the file's -N suffix


def test_every_memory_script_has_a_spec_or_a_reason() -> None:
    names = set(load_registry("memory").names())
    assert names - set(MEMORY_SPECS) == WITHOUT_SPEC
    assert set(MEMORY_SPECS) <= names


@pytest.mark.parametrize("name", sorted(MEMORY_SPECS))
def test_the_check_fails_on_a_mismatch(name: str) -> None:
    spec, source = MEMORY_SPECS[name], _source(name)
    assert _matches(spec, source)
    if spec.argv:  # two ARGV swapped, one renamed, one missing: each is caught
        swapped = (*spec.argv[1:2], *spec.argv[:1], *spec.argv[2:])
        if swapped != spec.argv:
            assert not _matches(dataclasses.replace(spec, argv=swapped), source)
        renamed = (*spec.argv[:-1], spec.argv[-1] + "_x")
        assert not _matches(dataclasses.replace(spec, argv=renamed), source)
        assert not _matches(dataclasses.replace(spec, argv=spec.argv[:-1]), source)
    assert not _matches(dataclasses.replace(spec, keys=(*spec.keys, "extra")), source)
    # A header edited without the spec: the same comparison fails.
    first_key = f"KEYS[1] {spec.keys[0]}"
    assert first_key in source
    assert not _matches(spec, source.replace(first_key, "KEYS[1] renamed_role", 1))


def test_calls_are_built_by_name_and_refuse_a_missing_or_unknown_name() -> None:
    from memtier.memory.scriptspecs import PARTITION_STATS, READ_CONTEXT

    keys = {"session": "s", "turns": "t", "meta": "m"}
    call = READ_CONTEXT.call(keys, limit=3, ttl_ms=10, clock_override="")
    assert call.keys == ("s", "t", "m") and call.args == (10, "", 3)
    assert READ_CONTEXT.arg(call, "limit") == 3
    changed = READ_CONTEXT.replace(call, limit=7)
    assert changed.args == (10, "", 7) and changed.keys == call.keys and call.args[2] == 3
    with pytest.raises(TypeError, match="missing"):
        READ_CONTEXT.call(keys, ttl_ms=10, clock_override="")
    with pytest.raises(TypeError, match="unknown"):
        READ_CONTEXT.call(keys, ttl_ms=10, clock_override="", limit=3, extra=1)
    with pytest.raises(TypeError, match="keys"):
        READ_CONTEXT.call({"session": "s", "turns": "t"}, ttl_ms=10, clock_override="", limit=3)
    with pytest.raises(KeyError):
        READ_CONTEXT.replace(call, nonsense=1)
    stats = PARTITION_STATS.call({"lru_public": "p", "lru_im": "i", "meta": "m", "index": "x"})
    assert stats.args == () and stats.keys == ("p", "i", "m", "x")
    one = ScriptSpec("one", keys=("k",), argv=("a",))
    assert one.call({"k": "K"}, a=1).args == (1,) and one.call(("K",), a=1).keys == ("K",)
