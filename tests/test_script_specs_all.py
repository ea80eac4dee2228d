"""Every Lua script under lua/ has exactly one declared ScriptSpec, equal to its header.

The families' own spec tests check their declarations one by one; this one checks the
whole set: a script added without a declaration (or a declaration left behind after a
script was removed or renamed) fails here.
"""

from __future__ import annotations

from pathlib import Path

from memtier.integrations import _checkpoint_core
from memtier.memory.scriptspecs import MEMORY_SPECS
from memtier.scripts import load_registry
from memtier.scriptspec import ScriptSpec, header_inputs
from memtier.threads import specs as thread_specs

LUA = Path(__file__).resolve().parents[1] / "lua"
FAMILIES: dict[str, tuple[ScriptSpec, ...]] = {
    "memory": tuple(MEMORY_SPECS.values()),
    "threads": tuple(thread_specs.SPECS),
    "langgraph": tuple(_checkpoint_core.SPECS),
}


def undeclared(family: str, specs: tuple[ScriptSpec, ...]) -> list[str]:
    """What differs between a family's scripts and its declarations (empty: in step)."""
    registry = load_registry(family)
    declared = [spec.script for spec in specs]
    problems = [f"{family}/{n}: declared twice" for n in set(declared) if declared.count(n) > 1]
    problems += [
        f"{family}/{n}: no ScriptSpec" for n in sorted(set(registry.names()) - set(declared))
    ]
    problems += [
        f"{family}/{n}: no such script" for n in sorted(set(declared) - set(registry.names()))
    ]
    for spec in specs:
        if spec.script not in registry.names():
            continue
        (path,) = (LUA / family).glob(f"{spec.script}-*.lua")
        if header_inputs(path.read_text()) != (spec.keys, spec.argv):
            problems.append(f"{family}/{spec.script}: header and spec differ")
        if len(spec.keys) != registry[spec.script].num_keys:
            problems.append(f"{family}/{spec.script}: KEYS count differs from the file name")
    return problems


def test_every_script_has_exactly_one_spec_equal_to_its_header() -> None:
    problems = [p for family, specs in FAMILIES.items() for p in undeclared(family, specs)]
    assert problems == []


def test_the_check_finds_a_missing_an_extra_and_a_changed_declaration() -> None:
    memory = FAMILIES["memory"]
    assert undeclared("memory", memory[1:]) == [f"memory/{memory[0].script}: no ScriptSpec"]
    ghost = ScriptSpec("no_such_script", keys=(), argv=())
    assert undeclared("memory", (*memory, ghost)) == ["memory/no_such_script: no such script"]
    changed = ScriptSpec(memory[0].script, memory[0].keys, (*memory[0].argv, "extra"))
    assert undeclared("memory", (changed, *memory[1:])) == [
        f"memory/{memory[0].script}: header and spec differ"
    ]
    assert undeclared("memory", (memory[0], *memory)) == [
        f"memory/{memory[0].script}: declared twice"
    ]
