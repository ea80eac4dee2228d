"""Declared script inputs: building calls by name, and reading a script's header."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from memtier.scriptspec import ScriptSpec, header_inputs

NAMES = st.lists(st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True), max_size=8, unique=True)


def header(keys: list[str], argv: list[str]) -> str:
    lines = ["#!lua", "--[[", "  What it does.", "", "  Input:"]
    lines += [f"    KEYS[{i}] {role}   the {role} key" for i, role in enumerate(keys, 1)]
    lines += [
        f"    ARGV[{i}] {name}   the {name}\n      continued text" for i, name in enumerate(argv, 1)
    ]
    lines += ["  Output: { 0 }", "]]", "local x = ARGV[1]", "return { 0 }"]
    return "\n".join(lines)


@given(NAMES, NAMES)
@example([], [])
@example(["session"], ["turn_id", "payload"])
def test_header_inputs_reads_what_a_header_declares(keys: list[str], argv: list[str]) -> None:
    assert header_inputs(header(keys, argv)) == (tuple(keys), tuple(argv))


@given(NAMES.filter(bool), NAMES.filter(bool), st.data())
def test_calls_built_by_name_put_every_value_at_its_position(
    keys: list[str], argv: list[str], data: st.DataObject
) -> None:
    spec = ScriptSpec("probe", tuple(keys), tuple(argv))
    values = {name: data.draw(st.text(max_size=5) | st.integers()) for name in argv}
    call = spec.call({role: f"k:{role}" for role in keys}, **values)
    assert call.keys == tuple(f"k:{role}" for role in keys)
    for name in argv:
        assert call.args[spec.index(name)] == values[name] == spec.arg(call, name)


@given(NAMES.filter(bool), NAMES, st.data())
@example(["session", "lru"], ["prefix", "turn_id"], None)
def test_a_bound_call_equals_the_call_built_by_name(
    keys: list[str], argv: list[str], data: st.DataObject | None
) -> None:
    """Any split of the inputs into bound (per partition) and free (per call): the bound
    call is the call :meth:`ScriptSpec.call` builds from all of them by name."""
    spec = ScriptSpec("probe", tuple(keys), tuple(argv))
    key_values = {role: f"k:{role}" for role in keys}
    arg_values: dict[str, str | int] = {name: f"v:{name}" for name in argv}
    if data is not None:
        arg_values = {n: data.draw(st.text(max_size=5) | st.integers()) for n in argv}
        fixed_keys = data.draw(st.sets(st.sampled_from(keys)))
        fixed_args = data.draw(st.sets(st.sampled_from(argv))) if argv else set()
    else:
        fixed_keys, fixed_args = {"lru"}, {"prefix"}
    bound = spec.bind(
        {r: key_values[r] for r in fixed_keys}, {n: arg_values[n] for n in fixed_args}
    )
    free_keys, free_args = bound.names
    assert set(free_keys) == set(keys) - fixed_keys
    assert set(free_args) == set(argv) - fixed_args
    call = bound.call(
        tuple(key_values[r] for r in free_keys), tuple(arg_values[n] for n in free_args)
    )
    assert call == spec.call(key_values, **arg_values)
    with pytest.raises(TypeError, match="bound call takes"):
        bound.call(
            tuple(key_values[r] for r in free_keys), (*(arg_values[n] for n in free_args), 1)
        )


def test_binding_an_unknown_name_is_refused() -> None:
    spec = ScriptSpec("probe", ("session",), ("turn_id",))
    with pytest.raises(TypeError, match="unknown inputs"):
        spec.bind({"sesion": "k"}, {})
    with pytest.raises(TypeError, match="unknown inputs"):
        spec.bind({}, {"turnid": 1})


def test_missing_or_unknown_names_are_refused() -> None:
    spec = ScriptSpec("probe", ("session",), ("a", "b"))
    with pytest.raises(TypeError, match="missing \\['b'\\]"):
        spec.call({"session": "s"}, a=1)
    with pytest.raises(TypeError, match="unknown \\['c'\\]"):
        spec.call({"session": "s"}, a=1, b=2, c=3)
    with pytest.raises(TypeError, match="keys"):
        spec.call({"other": "s"}, a=1, b=2)
    with pytest.raises(TypeError, match="takes 1 keys"):
        spec.call(("s", "t"), a=1, b=2)


def test_declarations_must_be_unique_identifiers() -> None:
    with pytest.raises(ValueError, match="twice"):
        ScriptSpec("probe", ("lru", "lru"), ())
    with pytest.raises(ValueError, match="identifier"):
        ScriptSpec("probe", (), ("Bad-Name",))


def test_a_header_with_a_gap_or_a_repeat_is_refused() -> None:
    with pytest.raises(ValueError, match=r"not 1\.\.n"):
        header_inputs("--[[\n KEYS[1] a x\n KEYS[3] c x\n]]")
    with pytest.raises(ValueError, match="twice"):
        header_inputs("--[[\n ARGV[1] a x\n ARGV[1] b x\n]]")
