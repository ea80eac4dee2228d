"""A limit is written once: one ``limits.Bound`` names its config section and field.

The config sections take from it the field's default, its validation and their
``BOUNDS``; this module keeps the fields and the Bounds in step and checks that the
binding refuses every way they could drift apart.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from memtier import limits
from memtier.config import (
    FROM_BOUND,
    ConversationConfig,
    MemtierConfig,
    RedisConfig,
    ThreadsConfig,
    _bind_bounds,
)
from memtier.errors import ConfigurationError

SECTIONS: dict[str, type[BaseModel]] = {
    "conversation": ConversationConfig,
    "threads": ThreadsConfig,
    "redis": RedisConfig,
}
ALL_BOUNDS = [v for v in vars(limits).values() if isinstance(v, limits.Bound)]
CONFIGURABLE = [b for b in ALL_BOUNDS if b.section]


def test_every_configurable_bound_is_one_field_of_a_known_section() -> None:
    assert {b.section for b in CONFIGURABLE} == set(SECTIONS)
    pairs = [(b.section, b.field) for b in CONFIGURABLE]
    assert len(pairs) == len(set(pairs)), "two Bounds name the same field"
    assert all(b.field for b in CONFIGURABLE)
    assert all(not b.field for b in ALL_BOUNDS if not b.section)


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_section_fields_and_bounds_are_in_step(section: str) -> None:
    model = SECTIONS[section]
    bounds = limits.configurable(section)
    assert bounds == model.BOUNDS  # type: ignore[attr-defined]
    defaults = model()
    for name, bound in bounds.items():
        info = model.model_fields[name]
        assert info.annotation is type(bound.default), name
        assert getattr(defaults, name) == bound.default and info.default == bound.default
        assert bound.minimum <= bound.default <= bound.ceiling, name
    # No field is left on the placeholder, and every non-bound field has its own default.
    assert all(f.default is not FROM_BOUND for f in model.model_fields.values())


@pytest.mark.parametrize("bound", CONFIGURABLE, ids=lambda b: f"{b.section}.{b.field}")
def test_above_the_ceiling_is_a_configuration_error_naming_the_field(bound: limits.Bound) -> None:
    over: Any = bound.ceiling * 2 if isinstance(bound.default, float) else int(bound.ceiling) + 1
    with pytest.raises(ConfigurationError) as caught:
        MemtierConfig.load(**{bound.section: {bound.field: over}})
    assert bound.field in caught.value.message and "ceiling" in caught.value.message


@pytest.mark.parametrize("bound", CONFIGURABLE, ids=lambda b: f"{b.section}.{b.field}")
def test_the_ceiling_itself_and_the_minimum_load(bound: limits.Bound) -> None:
    # Alone, any value between minimum and ceiling loads (dependent limits follow it).
    for value in (bound.ceiling, bound.minimum):
        typed: Any = value if isinstance(bound.default, float) else int(value)
        config = MemtierConfig.load(**{bound.section: {bound.field: typed}})
        assert getattr(getattr(config, bound.section), bound.field) == typed


def _model(**fields: Any) -> type[BaseModel]:
    annotations = {name: type_ for name, (type_, _) in fields.items()}
    namespace = {name: default for name, (_, default) in fields.items()}
    namespace["__annotations__"] = annotations
    return type("Probe", (BaseModel,), namespace)


def test_binding_refuses_a_field_without_a_bound() -> None:
    probe = _model(a=(int, FROM_BOUND), b=(int, FROM_BOUND))
    with pytest.raises(TypeError, match=r"without a limits\.Bound"):
        _bind_bounds(probe, {"a": limits.Bound(1, 2, 1, "x", "probe", "a")})


def test_binding_refuses_a_bound_without_a_field() -> None:
    probe = _model(a=(int, FROM_BOUND))
    bounds = {"a": limits.Bound(1, 2, 1, "x", "probe", "a"), "c": limits.Bound(1, 2, 1, "x")}
    with pytest.raises(TypeError, match=r"Bounds without a field \['c'\]"):
        _bind_bounds(probe, bounds)


def test_binding_refuses_a_field_of_another_type() -> None:
    probe = _model(a=(float, FROM_BOUND))
    with pytest.raises(TypeError, match="not the Bound's type"):
        _bind_bounds(probe, {"a": limits.Bound(1, 2, 1, "x", "probe", "a")})


def test_binding_gives_the_bound_default() -> None:
    probe = _model(a=(int, FROM_BOUND), other=(str, "kept"))
    _bind_bounds(probe, {"a": limits.Bound(7, 9, 1, "x", "probe", "a")})
    assert probe().model_dump() == {"a": 7, "other": "kept"}
