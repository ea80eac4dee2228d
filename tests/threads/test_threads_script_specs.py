"""Each lua/threads script's declared inputs (memtier.threads.specs) match its header.

The flows build every call by name from these specs, so a script whose header says
``ARGV[3] seq`` must be declared with ``seq`` third; a header changed without its
declaration (or the reverse) fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memtier.scripts import lua_root
from memtier.scriptspec import ScriptSpec, header_inputs
from memtier.threads.specs import SPECS

_FILE = re.compile(r"^(?P<name>[a-z_]+)-(?P<keys>\d+)\.lua$")


def _scripts() -> dict[str, tuple[int, str]]:
    """name -> (KEYS count from the file name, source) of every lua/threads script."""
    found: dict[str, tuple[int, str]] = {}
    for path in sorted(Path(lua_root(), "threads").iterdir()):
        match = _FILE.match(path.name)
        assert match is not None, path.name
        found[match["name"]] = (int(match["keys"]), path.read_text("utf-8"))
    return found


SCRIPTS = _scripts()


def test_every_threads_script_has_exactly_one_spec() -> None:
    names = [spec.script for spec in SPECS]
    assert len(names) == len(set(names))
    assert set(names) == set(SCRIPTS)


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.script)
def test_spec_equals_the_header(spec: ScriptSpec) -> None:
    n_keys, source = SCRIPTS[spec.script]
    assert header_inputs(source) == (spec.keys, spec.argv)
    assert len(spec.keys) == n_keys  # the loader asserts this count on every call


@given(
    spec=st.sampled_from(SPECS),
    data=st.data(),
)
def test_a_header_renamed_or_reordered_no_longer_matches(
    spec: ScriptSpec, data: st.DataObject
) -> None:
    """The negative case: any change of one input line's name, or a swap of two lines,
    is seen by the comparison (the test above cannot pass for a stale header)."""
    _, source = SCRIPTS[spec.script]
    kind = data.draw(st.sampled_from(["KEYS", "ARGV"] if spec.argv else ["KEYS"]))
    names = spec.keys if kind == "KEYS" else spec.argv
    i = data.draw(st.integers(0, len(names) - 1))
    header, rest = source.split("]]", 1)
    line = re.compile(rf"^(\s*{kind}\[{i + 1}\]\s+){names[i]}\b", re.MULTILINE)
    assert line.search(header), f"{kind}[{i + 1}] {names[i]} is not in the header"
    renamed = line.sub(rf"\g<1>{names[i]}_x", header, count=1) + "]]" + rest
    assert header_inputs(renamed) != (spec.keys, spec.argv)
    if len(names) > 1:
        j = (i + 1) % len(names)
        other = re.compile(rf"^(\s*{kind}\[{j + 1}\]\s+){names[j]}\b", re.MULTILINE)
        swapped = line.sub(r"\g<1>@@", header, count=1)
        swapped = other.sub(rf"\g<1>{names[i]}", swapped, count=1).replace("@@", names[j], 1)
        assert header_inputs(swapped + "]]" + rest) != (spec.keys, spec.argv)


def test_a_header_with_a_gap_or_a_repeat_is_refused() -> None:
    _, source = SCRIPTS["archive"]
    with pytest.raises(ValueError, match="numbering"):
        header_inputs(source.replace("ARGV[3] now_ms", "ARGV[9] now_ms", 1))
    with pytest.raises(ValueError, match="twice"):
        header_inputs(source.replace("ARGV[3] now_ms", "ARGV[2] now_ms", 1))


def test_calls_are_built_by_name_only() -> None:
    spec = next(s for s in SPECS if s.script == "hold")
    call = spec.call(("k",), marker="m", held="1", tenant="t", user="u")
    assert call.args == ("m", "1", "t", "u") and spec.arg(call, "held") == "1"
    with pytest.raises(TypeError, match="missing"):
        spec.call(("k",), marker="m", held="1", tenant="t")
    with pytest.raises(TypeError, match="unknown"):
        spec.call(("k",), marker="m", held="1", tenant="t", user="u", extra="x")
    with pytest.raises(TypeError, match="keys"):
        spec.call({"lease": "k"}, marker="m", held="1", tenant="t", user="u")
