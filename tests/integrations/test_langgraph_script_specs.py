"""Each lua/langgraph script's declared inputs (memtier.integrations._checkpoint_core)
match its header, and the saver's calls are built from them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memtier.integrations._checkpoint_core import SPECS, checkpoint_call
from memtier.keys import CheckpointKeyspace
from memtier.scripts import lua_root
from memtier.scriptspec import ScriptSpec, header_inputs

_FILE = re.compile(r"^(?P<name>[a-z_]+)-(?P<keys>\d+)\.lua$")
SCRIPTS = {
    m["name"]: (int(m["keys"]), p.read_text("utf-8"))
    for p in sorted(Path(lua_root(), "langgraph").iterdir())
    if (m := _FILE.match(p.name))
}


def test_every_langgraph_script_has_exactly_one_spec() -> None:
    names = [spec.script for spec in SPECS]
    assert len(names) == len(set(names)) and set(names) == set(SCRIPTS)


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.script)
def test_spec_equals_the_header(spec: ScriptSpec) -> None:
    n_keys, source = SCRIPTS[spec.script]
    assert header_inputs(source) == (spec.keys, spec.argv)
    assert len(spec.keys) == n_keys


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.script)
def test_a_stale_header_does_not_match(spec: ScriptSpec) -> None:
    """The negative case: rename the last KEYS role in the header; the comparison sees it."""
    _, source = SCRIPTS[spec.script]
    header, rest = source.split("]]", 1)
    n = len(spec.keys)
    line = re.compile(rf"^(\s*KEYS\[{n}\]\s+){spec.keys[-1]}\b", re.MULTILINE)
    assert line.search(header)
    stale = line.sub(rf"\g<1>{spec.keys[-1]}_old", header, count=1) + "]]" + rest
    assert header_inputs(stale) != (spec.keys, spec.argv)


def test_keys_come_by_role_from_the_thread_keys() -> None:
    keys = CheckpointKeyspace("ns").thread("t1")
    read = next(s for s in SPECS if s.script == "checkpoint_read")
    write = next(s for s in SPECS if s.script == "checkpoint_write")
    assert checkpoint_call(read, keys, tail=["x"], mode="ids").keys == keys.reads()
    call = checkpoint_call(
        write, keys, tail=["set", 3, "f", b"v"], thread_id="t1", ttl_ms=1, max_bytes=2
    )
    assert call.keys == keys.all() and call.args == ("t1", 1, 2, "set", 3, "f", b"v")
    with pytest.raises(TypeError, match="missing"):
        checkpoint_call(write, keys, thread_id="t1", ttl_ms=1)
