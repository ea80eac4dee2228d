"""Settings: one frozen pydantic-settings model, from a TOML file or ``MEMTIER_`` variables.

Nested fields use ``__`` in environment variables, e.g.
``MEMTIER_CONVERSATION__PUBLIC_TTL_SECONDS=60``.  Every bound is checked
against its hard ceiling in :mod:`memtier.limits`: configuration may only lower.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from memtier import limits
from memtier.errors import ConfigurationError

__all__ = ["ConversationConfig", "MemtierConfig", "RedisConfig", "ThreadsConfig", "parse_redis_url"]

REDIS_SCHEMES = ("redis", "rediss", "unix")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def _check_bound(value: float, info: ValidationInfo, bounds: dict[str, limits.Bound]) -> float:
    assert info.field_name is not None
    bound = bounds[info.field_name]
    if value > bound.ceiling:
        raise ValueError(
            f"{info.field_name}={value} is above its hard ceiling {bound.ceiling:g} {bound.unit}"
            " (configuration may only lower a bound)"
        )
    if value < bound.minimum:
        raise ValueError(f"{info.field_name}={value} is below the minimum {bound.minimum:g}")
    return value


class ConversationConfig(BaseModel):
    """The ``[conversation]`` section: conversation-memory bounds and persistence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    BOUNDS: ClassVar[dict[str, limits.Bound]] = {
        "public_ttl_seconds": limits.PUBLIC_TTL_SECONDS,
        "im_ttl_seconds": limits.IM_TTL_SECONDS,
        "max_active_sessions": limits.MAX_ACTIVE_SESSIONS,
        "max_turns_per_session": limits.MAX_TURNS_PER_SESSION,
        "max_session_bytes": limits.MAX_SESSION_BYTES,
        "max_aggregate_bytes": limits.MAX_AGGREGATE_BYTES,
        "max_tool_results": limits.MAX_TOOL_RESULTS,
        "max_tool_result_bytes": limits.MAX_TOOL_RESULT_BYTES,
        "max_summary_bytes": limits.MAX_SUMMARY_BYTES,
        "max_snapshot_bytes": limits.MAX_SNAPSHOT_BYTES,
        "max_turn_bytes": limits.MAX_TURN_BYTES,
        "max_events": limits.MAX_EVENTS,
    }

    persistence_enabled: bool = False
    storage_path: Path = Path("./memtier-data")
    public_ttl_seconds: float = limits.PUBLIC_TTL_SECONDS.default
    im_ttl_seconds: float = limits.IM_TTL_SECONDS.default
    max_active_sessions: int = int(limits.MAX_ACTIVE_SESSIONS.default)
    max_turns_per_session: int = int(limits.MAX_TURNS_PER_SESSION.default)
    max_session_bytes: int = int(limits.MAX_SESSION_BYTES.default)
    max_aggregate_bytes: int = int(limits.MAX_AGGREGATE_BYTES.default)
    max_tool_results: int = int(limits.MAX_TOOL_RESULTS.default)
    max_tool_result_bytes: int = int(limits.MAX_TOOL_RESULT_BYTES.default)
    max_summary_bytes: int = int(limits.MAX_SUMMARY_BYTES.default)
    max_snapshot_bytes: int = int(limits.MAX_SNAPSHOT_BYTES.default)
    max_turn_bytes: int = int(limits.MAX_TURN_BYTES.default)
    max_events: int = int(limits.MAX_EVENTS.default)

    @field_validator(*BOUNDS.keys())
    @classmethod
    def _within_ceiling(cls, value: float, info: ValidationInfo) -> float:
        return _check_bound(value, info, cls.BOUNDS)

    @model_validator(mode="after")
    def _consistent(self) -> ConversationConfig:
        if self.max_turn_bytes > self.max_session_bytes:
            raise ValueError("max_turn_bytes must not exceed max_session_bytes")
        if self.max_tool_result_bytes > self.max_turn_bytes:
            raise ValueError("max_tool_result_bytes must not exceed max_turn_bytes")
        if self.max_summary_bytes > self.max_session_bytes // 2:
            raise ValueError("max_summary_bytes must not exceed half of max_session_bytes")
        return self

    @property
    def public_ttl_ms(self) -> int:
        return max(1, round(self.public_ttl_seconds * 1000))

    @property
    def im_ttl_ms(self) -> int:
        return max(1, round(self.im_ttl_seconds * 1000))


class ThreadsConfig(BaseModel):
    """The ``[threads]`` section: the frozen limits of the conversation-threads service."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    BOUNDS: ClassVar[dict[str, limits.Bound]] = {
        "list_page": limits.THREAD_LIST_PAGE,
        "replay_page_rows": limits.REPLAY_PAGE_ROWS,
        "cursor_bytes": limits.CURSOR_BYTES,
        "title_bytes": limits.THREAD_TITLE_BYTES,
        "request_id_bytes": limits.REQUEST_ID_BYTES,
        "max_active_branches": limits.ACTIVE_BRANCHES,
        "export_bytes": limits.EXPORT_BYTES,
        "export_pages": limits.EXPORT_PAGES,
        "request_body_bytes": limits.REQUEST_BODY_BYTES,
    }

    list_page: int = int(limits.THREAD_LIST_PAGE.default)
    replay_page_rows: int = int(limits.REPLAY_PAGE_ROWS.default)
    cursor_bytes: int = int(limits.CURSOR_BYTES.default)
    title_bytes: int = int(limits.THREAD_TITLE_BYTES.default)
    request_id_bytes: int = int(limits.REQUEST_ID_BYTES.default)
    max_active_branches: int = int(limits.ACTIVE_BRANCHES.default)
    export_bytes: int = int(limits.EXPORT_BYTES.default)
    export_pages: int = int(limits.EXPORT_PAGES.default)
    request_body_bytes: int = int(limits.REQUEST_BODY_BYTES.default)
    base_path: str = "/memtier/conversations"

    @field_validator(*BOUNDS.keys())
    @classmethod
    def _within_ceiling(cls, value: float, info: ValidationInfo) -> float:
        return _check_bound(value, info, cls.BOUNDS)


class RedisConfig(BaseModel):
    """The ``[redis]`` section: connection pool, socket deadlines and the retry horizon.

    ``MEMTIER_REDIS__MAX_CONNECTIONS=100`` and so on.  Each has a default and a hard
    ceiling in :mod:`memtier.limits`; configuration may only lower it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    BOUNDS: ClassVar[dict[str, limits.Bound]] = {
        "max_connections": limits.REDIS_MAX_CONNECTIONS,
        "pool_timeout_seconds": limits.REDIS_POOL_TIMEOUT_SECONDS,
        "socket_timeout_seconds": limits.REDIS_SOCKET_TIMEOUT_SECONDS,
        "connect_timeout_seconds": limits.REDIS_CONNECT_TIMEOUT_SECONDS,
        "retry_horizon_seconds": limits.RETRY_HORIZON_SECONDS,
    }

    max_connections: int = int(limits.REDIS_MAX_CONNECTIONS.default)
    pool_timeout_seconds: float = limits.REDIS_POOL_TIMEOUT_SECONDS.default
    socket_timeout_seconds: float = limits.REDIS_SOCKET_TIMEOUT_SECONDS.default
    connect_timeout_seconds: float = limits.REDIS_CONNECT_TIMEOUT_SECONDS.default
    retry_horizon_seconds: float = limits.RETRY_HORIZON_SECONDS.default

    @field_validator(*BOUNDS.keys())
    @classmethod
    def _within_ceiling(cls, value: float, info: ValidationInfo) -> float:
        return _check_bound(value, info, cls.BOUNDS)


class MemtierConfig(BaseSettings):
    """All of memtier's settings.

    ``redis_url``: ``redis://`` / ``rediss://`` / ``unix://`` for one server,
    ``redis+cluster://host:port`` (or ``rediss+cluster://``) for Redis Cluster,
    ``None`` for the embedded in-process Redis (fakeredis; demo and tests only).
    """

    model_config = SettingsConfigDict(
        env_prefix="MEMTIER_",
        env_nested_delimiter="__",
        frozen=True,
        extra="forbid",
    )

    redis_url: str | None = None
    namespace: str = Field(default="memtier", pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    partitions: int = Field(default=1, ge=1, le=limits.MAX_PARTITIONS)
    conversation: ConversationConfig = ConversationConfig()
    threads: ThreadsConfig = ThreadsConfig()
    redis: RedisConfig = RedisConfig()

    @field_validator("redis_url")
    @classmethod
    def _known_scheme(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_redis_url(value)
            except ConfigurationError as exc:
                raise ValueError(exc.message) from None
        return value

    @model_validator(mode="after")
    def _partitions_fit(self) -> MemtierConfig:
        conv = self.conversation
        if conv.max_active_sessions < self.partitions:
            raise ValueError("max_active_sessions must be at least the number of partitions")
        if conv.max_aggregate_bytes // self.partitions < conv.max_session_bytes:
            raise ValueError(
                "max_aggregate_bytes / partitions must hold at least one full session"
                " (max_session_bytes)"
            )
        return self

    @classmethod
    def load(cls, **overrides: Any) -> MemtierConfig:
        """Build from environment variables plus ``overrides``; errors become ConfigurationError."""
        try:
            return cls(**overrides)
        except PydanticValidationError as exc:
            raise ConfigurationError(_describe(exc)) from exc

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> MemtierConfig:
        """Load a TOML file (top-level keys plus ``[conversation]``, ``[threads]``, ``[redis]``)."""
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"cannot read config file {path}: {exc}") from exc
        data.update(overrides)
        return cls.load(**data)


def _describe(exc: PydanticValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        parts.append(f"{loc}: {err['msg']}" if loc else err["msg"])
    return "invalid configuration: " + "; ".join(parts)


def parse_redis_url(url: str) -> tuple[bool, str]:
    """Return ``(is_cluster, url_for_redis_py)``; unknown schemes raise ConfigurationError."""
    scheme = urlsplit(url).scheme
    if scheme in CLUSTER_SCHEMES:
        return True, scheme.replace("+cluster", "") + url[len(scheme) :]
    if scheme in REDIS_SCHEMES:
        return False, url
    raise ConfigurationError(
        f"unknown Redis URL scheme {scheme!r}: use one of "
        + ", ".join(f"{s}://" for s in REDIS_SCHEMES + CLUSTER_SCHEMES)
    )
