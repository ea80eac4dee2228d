"""Configuration: hard ceilings, TOML, environment, DSN schemes."""

from __future__ import annotations

from pathlib import Path

import pytest

from memtier import ConfigurationError, MemtierConfig
from memtier.config import ConversationConfig, parse_redis_url

CEILINGS = {name: bound.ceiling for name, bound in ConversationConfig.BOUNDS.items()}


@pytest.mark.parametrize("field", sorted(CEILINGS))
def test_each_bound_may_be_lowered_but_never_raised(field: str) -> None:
    ceiling = CEILINGS[field]
    with pytest.raises(ConfigurationError) as info:
        MemtierConfig.load(conversation={field: ceiling * 2})
    message = str(info.value)
    assert field in message and ConversationConfig.BOUNDS[field].describe(ceiling) in message
    assert info.value.code == "configuration_error"


def test_lowered_values_are_accepted_and_ttls_take_fractions() -> None:
    cfg = MemtierConfig.load(
        conversation={"public_ttl_seconds": 1.5, "im_ttl_seconds": 0.25, "max_turns_per_session": 8}
    )
    assert cfg.conversation.public_ttl_ms == 1500
    assert cfg.conversation.im_ttl_ms == 250
    assert cfg.conversation.max_turns_per_session == 8


def test_defaults_are_the_spec_ttls() -> None:
    cfg = MemtierConfig.load()
    assert cfg.conversation.public_ttl_ms == 30 * 60 * 1000
    assert cfg.conversation.im_ttl_ms == 24 * 60 * 60 * 1000


def test_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "memtier.toml"
    path.write_text(
        'redis_url = "redis+cluster://127.0.0.1:7000"\n'
        'namespace = "prod"\npartitions = 4\n'
        "[conversation]\npersistence_enabled = true\n"
        'storage_path = "/var/lib/memtier"\nmax_turns_per_session = 50\n'
    )
    cfg = MemtierConfig.from_toml(path)
    assert (cfg.namespace, cfg.partitions) == ("prod", 4)
    assert cfg.conversation.persistence_enabled is True
    assert cfg.conversation.storage_path == Path("/var/lib/memtier")
    assert cfg.conversation.max_turns_per_session == 50


def test_from_toml_rejects_unknown_fields_and_ceilings(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[conversation]\nmax_turn_bytes = 99999999\n")
    with pytest.raises(ConfigurationError, match="max_turn_bytes"):
        MemtierConfig.from_toml(path)
    path.write_text("[conversation]\ngroup_ttl_seconds = 5\n")
    with pytest.raises(ConfigurationError, match="group_ttl_seconds"):
        MemtierConfig.from_toml(path)
    with pytest.raises(ConfigurationError):
        MemtierConfig.from_toml(tmp_path / "missing.toml")


def test_environment_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMTIER_REDIS_URL", "redis://127.0.0.1:6399/2")
    monkeypatch.setenv("MEMTIER_NAMESPACE", "envns")
    monkeypatch.setenv("MEMTIER_CONVERSATION__PUBLIC_TTL_SECONDS", "60")
    cfg = MemtierConfig.load()
    assert cfg.redis_url == "redis://127.0.0.1:6399/2"
    assert cfg.namespace == "envns"
    assert cfg.conversation.public_ttl_ms == 60_000
    monkeypatch.setenv("MEMTIER_CONVERSATION__PUBLIC_TTL_SECONDS", "3600")
    with pytest.raises(ConfigurationError, match="public_ttl_seconds"):
        MemtierConfig.load()


def test_redis_url_schemes() -> None:
    assert parse_redis_url("redis://h:1/0") == (False, "redis://h:1/0")
    assert parse_redis_url("rediss+cluster://h:1") == (True, "rediss://h:1")
    with pytest.raises(ConfigurationError, match="unknown Redis URL scheme"):
        parse_redis_url("http://h:1")
    with pytest.raises(ConfigurationError, match="redis_url"):
        MemtierConfig.load(redis_url="memcached://x")


def test_inconsistent_bounds_are_rejected() -> None:
    with pytest.raises(ConfigurationError, match="max_turn_bytes"):
        MemtierConfig.load(conversation={"max_turn_bytes": 8192, "max_session_bytes": 4096})
    with pytest.raises(ConfigurationError, match="partitions"):
        MemtierConfig.load(partitions=8, conversation={"max_active_sessions": 4})
