"""Configuration findings of issue 8: lowering one limit alone always works, dependent
defaults follow, only two explicit values contradict, nan/inf refused, every config
class raises ConfigurationError, ceilings printed exactly, the snapshot minimum."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import memfixtures
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from memhelpers import Clock, StoreMaker, key

from memtier import (
    AvatarMessage,
    ConfigurationError,
    MemtierConfig,
    SnapshotError,
    limits,
)
from memtier.config import LIMIT_DEPENDENCIES, ConversationConfig, ThreadsConfig
from memtier.memory import snapshot

fake_or_real = memfixtures.fake_or_real  # the fixture, in this module's namespace
make_store = memfixtures.make_store  # the store tests: sync and asyncio store (issue 13)

CONV_BOUNDS = ConversationConfig.BOUNDS
THREAD_BOUNDS = ThreadsConfig.BOUNDS
DEPENDENT = sorted({name for edge in LIMIT_DEPENDENCIES for name in edge[:2]})


def _value_in(bound: limits.Bound, data: st.DataObject) -> float:
    if bound.unit == "s":
        return data.draw(st.floats(bound.minimum, bound.ceiling, allow_nan=False))
    return data.draw(st.integers(int(bound.minimum), int(bound.ceiling)))


def _assert_dependencies_hold(cfg: MemtierConfig) -> None:
    conv = cfg.conversation
    for small, large, factor in LIMIT_DEPENDENCIES:
        assert (factor or cfg.partitions) * getattr(conv, small) <= getattr(conv, large), (
            small,
            large,
        )
    assert cfg.partitions <= conv.max_active_sessions
    for name, bound in CONV_BOUNDS.items():
        assert bound.minimum <= getattr(conv, name) <= bound.ceiling, name


# --- lowering one limit alone ---------------------------------------------------------------


def test_max_turn_bytes_alone_lowers_the_tool_result_default() -> None:
    cfg = MemtierConfig.load(conversation={"max_turn_bytes": 1000})
    assert cfg.conversation.max_turn_bytes == 1000
    assert cfg.conversation.max_tool_result_bytes == 1000  # followed it down
    assert ConversationConfig(max_turn_bytes=1000).max_tool_result_bytes == 1000


def test_max_aggregate_bytes_alone_lowers_the_session_default() -> None:
    cfg = MemtierConfig.load(conversation={"max_aggregate_bytes": 20000})
    conv = cfg.conversation
    assert (conv.max_aggregate_bytes, conv.max_session_bytes) == (20000, 20000)
    assert conv.max_turn_bytes == 16 * 1024
    assert conv.max_summary_bytes <= 10000
    # With partitions the session default follows the per-partition share.
    cfg = MemtierConfig.load(partitions=4, conversation={"max_aggregate_bytes": 20000})
    assert cfg.conversation.max_session_bytes == 5000
    _assert_dependencies_hold(cfg)


def test_raising_a_smaller_limit_alone_raises_the_default_above_it() -> None:
    conv = MemtierConfig.load(conversation={"max_tool_result_bytes": 64 * 1024}).conversation
    assert conv.max_turn_bytes == 64 * 1024
    cfg = MemtierConfig.load(partitions=1024, conversation={"max_session_bytes": 4 * 1024**2})
    assert cfg.conversation.max_aggregate_bytes == 4 * 1024**3


def test_one_limit_alone_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMTIER_CONVERSATION__MAX_TURN_BYTES", "1000")
    assert MemtierConfig.load().conversation.max_tool_result_bytes == 1000
    monkeypatch.delenv("MEMTIER_CONVERSATION__MAX_TURN_BYTES")
    monkeypatch.setenv("MEMTIER_CONVERSATION__MAX_AGGREGATE_BYTES", "20000")
    monkeypatch.setenv("MEMTIER_PARTITIONS", "4")
    assert MemtierConfig.load().conversation.max_session_bytes == 5000


def test_a_store_with_one_lowered_limit_works(make_store: StoreMaker, fake_or_real: Any) -> None:
    store = make_store(fake_or_real, Clock(), conversation={"max_turn_bytes": 1000})
    receipt = store.append(key(1), AvatarMessage(text="x" * 5000))
    assert receipt.truncated and receipt.bytes <= 1000


@given(data=st.data())
def test_any_single_bound_in_range_loads(data: st.DataObject) -> None:
    section = data.draw(st.sampled_from(["conversation", "threads", "partitions"]))
    if section == "partitions":
        value = data.draw(st.integers(1, limits.MAX_PARTITIONS))
        cfg = MemtierConfig.load(partitions=value)
        assert cfg.partitions == value
        _assert_dependencies_hold(cfg)
        return
    bounds = CONV_BOUNDS if section == "conversation" else THREAD_BOUNDS
    name = data.draw(st.sampled_from(sorted(bounds)))
    value = _value_in(bounds[name], data)
    cfg = MemtierConfig.load(**{section: {name: value}})
    assert getattr(getattr(cfg, section), name) == value
    _assert_dependencies_hold(cfg)


@pytest.mark.parametrize("name", sorted(CONV_BOUNDS))
def test_each_bound_alone_at_its_minimum_and_ceiling_loads(name: str) -> None:
    bound = CONV_BOUNDS[name]
    for value in (bound.minimum, bound.ceiling):
        cfg = MemtierConfig.load(conversation={name: value})
        assert getattr(cfg.conversation, name) == value
        _assert_dependencies_hold(cfg)
        direct = ConversationConfig(**{name: value})
        assert getattr(direct, name) == value


# --- contradictions need two explicit values ------------------------------------------------


def _oracle_contradiction(explicit: dict[str, int], partitions: int) -> bool:
    """Independent check: is there no assignment of the defaulted limits at all?"""
    lo = {n: CONV_BOUNDS[n].minimum for n in DEPENDENT}
    hi = {n: CONV_BOUNDS[n].ceiling for n in DEPENDENT}
    for name, value in explicit.items():
        lo[name] = hi[name] = value
    for _ in range(len(DEPENDENT) + 1):  # propagate along the chain until stable
        for small, large, factor in LIMIT_DEPENDENCIES:
            f = factor or partitions
            lo[large] = max(lo[large], lo[small] * f)
            hi[small] = min(hi[small], hi[large] // f)
    return any(lo[n] > hi[n] for n in DEPENDENT)


@given(
    explicit=st.dictionaries(
        st.sampled_from(DEPENDENT),
        st.sampled_from([64, 256, 1000, 1024, 4096, 20000, 65536, 262144, 4 * 1024**2]),
        max_size=4,
    ),
    partitions=st.one_of(st.none(), st.sampled_from([1, 2, 8, 1024])),
)
@example(explicit={"max_turn_bytes": 4096, "max_session_bytes": 1024}, partitions=None)
@example(explicit={"max_aggregate_bytes": 1024}, partitions=2)
def test_only_explicit_values_contradict_and_the_error_names_both(
    explicit: dict[str, int], partitions: int | None
) -> None:
    explicit = {n: v for n, v in explicit.items() if CONV_BOUNDS[n].minimum <= v}
    explicit = {n: v for n, v in explicit.items() if v <= CONV_BOUNDS[n].ceiling}
    overrides: dict[str, Any] = {"conversation": explicit}
    if partitions is not None:
        overrides["partitions"] = partitions
    expect_error = _oracle_contradiction(explicit, partitions or 1)
    try:
        cfg = MemtierConfig.load(**overrides)
    except ConfigurationError as exc:
        assert expect_error, str(exc)
        named = [n for n in [*explicit, "partitions"] if n in str(exc)]
        if partitions is None:
            named = [n for n in named if n != "partitions"]
        assert len(named) >= 2, str(exc)
        assert exc.code == "configuration_error"
        return
    assert not expect_error, overrides
    for name, value in explicit.items():
        assert getattr(cfg.conversation, name) == value
    _assert_dependencies_hold(cfg)


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        ({"conversation": {"max_turn_bytes": 8192, "max_session_bytes": 4096}}, 2),
        ({"conversation": {"max_tool_result_bytes": 60000, "max_session_bytes": 32768}}, 2),
        ({"conversation": {"max_summary_bytes": 4096, "max_session_bytes": 4096}}, 2),
        ({"partitions": 2, "conversation": {"max_aggregate_bytes": 1024}}, 2),
        ({"partitions": 8, "conversation": {"max_active_sessions": 4}}, 2),
    ],
)
def test_two_explicit_contradicting_values_name_both(overrides: dict[str, Any], names: int) -> None:
    with pytest.raises(ConfigurationError) as info:
        MemtierConfig.load(**overrides)
    fields = [
        *overrides.get("conversation", {}),
        *(["partitions"] if "partitions" in overrides else []),
    ]
    assert len(fields) == names
    for field in fields:
        assert field in str(info.value)


# --- nan / inf, and every class raising ConfigurationError ----------------------------------


@pytest.mark.parametrize("raw", ["nan", "NaN", "inf", "-inf", "Infinity"])
@pytest.mark.parametrize(
    "variable",
    [
        "MEMTIER_CONVERSATION__PUBLIC_TTL_SECONDS",
        "MEMTIER_CONVERSATION__IM_TTL_SECONDS",
        "MEMTIER_CONVERSATION__MAX_TURN_BYTES",
    ],
)
def test_nan_and_inf_are_refused_at_load(
    raw: str, variable: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, raw)
    with pytest.raises(ConfigurationError) as info:
        MemtierConfig.load()
    assert variable.removeprefix("MEMTIER_CONVERSATION__").lower() in str(info.value)


def test_nan_and_inf_are_refused_in_toml_and_directly(tmp_path: Path) -> None:
    path = tmp_path / "memtier.toml"
    for literal in ("nan", "inf", "-inf"):
        path.write_text(f"[conversation]\npublic_ttl_seconds = {literal}\n")
        with pytest.raises(ConfigurationError, match="public_ttl_seconds"):
            MemtierConfig.from_toml(path)
        with pytest.raises(ConfigurationError, match="im_ttl_seconds"):
            ConversationConfig(im_ttl_seconds=float(literal))


@pytest.mark.parametrize(
    "build",
    [
        lambda: ConversationConfig(max_turn_bytes=10**9),
        lambda: ConversationConfig(max_turn_bytes="many"),
        lambda: ConversationConfig(group_ttl_seconds=5),
        lambda: ConversationConfig(max_turn_bytes=8192, max_session_bytes=4096),
        lambda: ConversationConfig.model_validate({"max_events": 0}),
        lambda: ThreadsConfig(list_page=10**6),
        lambda: ThreadsConfig(unknown=1),
        lambda: ThreadsConfig.model_validate({"cursor_bytes": 1}),
        lambda: MemtierConfig(partitions=0),
        lambda: MemtierConfig(namespace="bad namespace!"),
        lambda: MemtierConfig(conversation={"max_session_bytes": 10**12}),
        lambda: MemtierConfig.model_validate({"partitions": 99999}),
    ],
)
def test_every_config_class_raises_configuration_error(build: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        build()
    assert info.value.code == "configuration_error"
    assert isinstance(info.value, ValueError)  # as pydantic's ValidationError was
    assert "pydantic" not in str(info.value)


# --- ceilings printed exactly ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CONV_BOUNDS))
def test_ceilings_are_printed_exactly_with_a_unit(name: str) -> None:
    bound = CONV_BOUNDS[name]
    with pytest.raises(ConfigurationError) as info:
        MemtierConfig.load(conversation={name: bound.ceiling * 2})
    message = str(info.value)
    assert bound.describe(bound.ceiling) in message
    assert "e+" not in message


def test_describe_is_exact() -> None:
    assert limits.describe(4 * 1024**2, "bytes") == "4 MiB (4194304 bytes)"
    assert limits.describe(64 * 1024**3, "bytes") == "64 GiB (68719476736 bytes)"
    assert limits.describe(1000, "bytes") == "1000 bytes"
    assert limits.describe(1800.0, "s") == "1800 s (30 min)"
    assert limits.describe(86400.0, "s") == "86400 s (24 h)"
    assert limits.describe(0.001, "s") == "0.001 s"
    assert limits.describe(1_000_000, "sessions") == "1000000 sessions"
    with pytest.raises(ConfigurationError, match=r"4 MiB \(4194304 bytes\)"):
        MemtierConfig.load(conversation={"max_session_bytes": 4 * 1024**2 + 1})


# --- max_snapshot_bytes: the smallest generation that can be written --------------------------


def test_the_snapshot_minimum_is_the_empty_generation() -> None:
    assert limits.MAX_SNAPSHOT_BYTES.minimum == snapshot.HEADER_BLOCK
    with pytest.raises(ConfigurationError, match="max_snapshot_bytes"):
        MemtierConfig.load(conversation={"max_snapshot_bytes": snapshot.HEADER_BLOCK - 1})


def test_a_store_at_the_snapshot_minimum_can_flush(
    make_store: StoreMaker, fake_or_real: Any, tmp_path: Path
) -> None:
    minimum = int(limits.MAX_SNAPSHOT_BYTES.minimum)
    conversation = {
        "persistence_enabled": True,
        "storage_path": str(tmp_path),
        "max_snapshot_bytes": minimum,
    }
    store = make_store(fake_or_real, Clock(), conversation=conversation)
    for _ in range(2):  # and again: retention keeps the newest generation within the ceiling
        result = store.flush()
        assert result.sessions == 0
        files = sorted((tmp_path / "conversations").glob("*.snapshot"))
        assert files and all(f.stat().st_size <= minimum for f in files)
    # A session does not fit in an empty generation: refused before publishing.
    store.append(key(1), AvatarMessage(text="hello"))
    with pytest.raises(SnapshotError):
        store.flush()
