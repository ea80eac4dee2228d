"""Settings: one frozen pydantic-settings model, from a TOML file or ``MEMTIER_`` variables.

Nested fields use ``__`` in environment variables, e.g.
``MEMTIER_CONVERSATION__PUBLIC_TTL_SECONDS=60``.  Every bound is checked
against its hard ceiling in :mod:`memtier.limits`: configuration may only lower.
Numbers must be finite (``nan`` and ``inf`` are refused).

Limits that depend on each other (:data:`LIMIT_DEPENDENCIES`)::

    max_tool_result_bytes <= max_turn_bytes <= max_session_bytes
    2 * max_summary_bytes <= max_session_bytes
    partitions * max_session_bytes <= max_aggregate_bytes
    partitions <= max_active_sessions

A limit that was not set follows the ones that were: its default is moved (down or up,
never past its own ceiling or minimum) just as far as the set values need.  So setting
any one limit alone to any value between its minimum and its ceiling always loads
(``max_turn_bytes=1000`` lowers the default ``max_tool_result_bytes`` to 1000;
``max_aggregate_bytes=20000`` lowers ``max_session_bytes`` to 20000, and the turn and
summary defaults after it).  Only values that were set explicitly can contradict each
other; that is a :class:`~memtier.errors.ConfigurationError` naming both fields.

Every config class raises :class:`~memtier.errors.ConfigurationError` (code
``configuration_error``) for invalid input, whether built directly, with
:meth:`MemtierConfig.load` or from a TOML file -- never pydantic's ``ValidationError``.

Precedence, highest first (as pydantic-settings and twelve-factor users expect):
explicit arguments (``MemtierConfig.load(**overrides)``, ``from_toml(path,
**overrides)``, the CLI's ``--redis-url`` / ``--namespace``), then ``MEMTIER_*``
environment variables, then the TOML file, then the defaults.  Nested tables merge
field by field: ``MEMTIER_CONVERSATION__MAX_EVENTS`` overrides only that field of the
file's ``[conversation]`` table.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, Final, Literal, Self
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic import ValidationError as PydanticValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from memtier import limits
from memtier.errors import ConfigurationError

__all__ = [
    "LIMIT_DEPENDENCIES",
    "ConversationConfig",
    "MemtierConfig",
    "RedisConfig",
    "ThreadsConfig",
    "parse_redis_url",
]

REDIS_SCHEMES = ("redis", "rediss", "unix")
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")


def _check_bound(value: float, info: ValidationInfo, bounds: dict[str, limits.Bound]) -> float:
    assert info.field_name is not None
    bound = bounds[info.field_name]
    if not math.isfinite(value):
        raise ValueError(f"{info.field_name}={value} is not a finite number")
    if value > bound.ceiling:
        raise ValueError(
            f"{info.field_name}={bound.describe(value)} is above its hard ceiling"
            f" {bound.describe(bound.ceiling)} (configuration may only lower a bound)"
        )
    if value < bound.minimum:
        raise ValueError(
            f"{info.field_name}={bound.describe(value)} is below the minimum"
            f" {bound.describe(bound.minimum)}"
        )
    return value


class _FromBound:
    """The placeholder default of a bound field (see :func:`_bind_bounds`)."""

    def __repr__(self) -> str:
        return "FROM_BOUND"


# A section declares each bound field as ``name: int = FROM_BOUND`` (its type, for readers
# and mypy); the value, the validation and the section's BOUNDS come from the one
# limits.Bound whose ``field`` is that name.
FROM_BOUND: Any = _FromBound()


def _bind_bounds(model: type[BaseModel], bounds: Mapping[str, limits.Bound]) -> None:
    """Give every ``FROM_BOUND`` field of ``model`` its Bound's default (once, at import).

    Raises TypeError when a field has no Bound, a Bound of the section has no field, or
    a field's type is not its Bound's (an int limit stays an int), so a limit can only be
    added in :mod:`memtier.limits` and declared here together.
    """
    placeholders = {n for n, f in model.model_fields.items() if f.default is FROM_BOUND}
    if placeholders != set(bounds):
        raise TypeError(
            f"{model.__name__}: fields without a limits.Bound {sorted(placeholders - set(bounds))},"
            f" Bounds without a field {sorted(set(bounds) - placeholders)}"
        )
    for name, bound in bounds.items():
        info = model.model_fields[name]
        if info.annotation is not type(bound.default):
            raise TypeError(f"{model.__name__}.{name}: {info.annotation} is not the Bound's type")
        info.default = bound.default
    model.model_rebuild(force=True)


# (smaller, larger, factor): ``factor * smaller <= larger``; factor 0 = the partitions.
LIMIT_DEPENDENCIES: Final = (
    ("max_tool_result_bytes", "max_turn_bytes", 1),
    ("max_turn_bytes", "max_session_bytes", 1),
    ("max_summary_bytes", "max_session_bytes", 2),
    ("max_session_bytes", "max_aggregate_bytes", 0),
)


def _paths(start: str, forward: bool, partitions: int) -> dict[str, int]:
    """Every limit reachable from ``start`` (up when ``forward``), with the product of the
    factors on the way (the graph is a small tree: one path each)."""
    found: dict[str, int] = {}
    todo = [(start, 1)]
    while todo:  # bounded: at most len(LIMIT_DEPENDENCIES) edges are followed
        name, factor = todo.pop()
        for small, large, edge in LIMIT_DEPENDENCIES:
            step = edge or partitions
            if forward and small == name and large not in found:
                found[large] = factor * step
                todo.append((large, factor * step))
            elif not forward and large == name and small not in found:
                found[small] = factor * step
                todo.append((small, factor * step))
    return found


def resolve_limits(
    explicit: Mapping[str, float],
    bounds: Mapping[str, limits.Bound],
    partitions: int = 1,
    partitions_explicit: bool = False,
) -> dict[str, float]:
    """The values of the dependent limits: ``explicit`` ones as given, the others moved
    from their defaults just as far as the explicit ones need.

    Raises ValueError naming both fields when two explicit values contradict (or one
    explicit value, through ``partitions``, leaves another limit no room).
    """
    where = f" with partitions={partitions}" if partitions_explicit else ""
    out: dict[str, float] = {}
    names = {n for edge in LIMIT_DEPENDENCIES for n in edge[:2]}
    for name in sorted(names):
        if name in explicit:
            out[name] = explicit[name]
            for larger, factor in _paths(name, True, partitions).items():
                if larger in explicit and explicit[name] * factor > explicit[larger]:
                    raise ValueError(
                        f"{name}={bounds[name].describe(explicit[name])} and {larger}="
                        f"{bounds[larger].describe(explicit[larger])}"
                        f" contradict each other{where}: {larger} must be at least"
                        f" {factor} x {name}"
                    )
            continue
        bound = bounds[name]
        low, low_by = bound.minimum, ""
        for smaller, factor in _paths(name, False, partitions).items():
            if smaller in explicit and explicit[smaller] * factor > low:
                low, low_by = explicit[smaller] * factor, smaller
        high, high_by = bound.ceiling, ""
        for larger, factor in _paths(name, True, partitions).items():
            if larger in explicit and explicit[larger] // factor < high:
                high, high_by = explicit[larger] // factor, larger
        if low > high:
            parts = f" and partitions={partitions}" if partitions_explicit else ""
            if low_by and high_by:
                message = (
                    f"{low_by}={bounds[low_by].describe(explicit[low_by])} and {high_by}="
                    f"{bounds[high_by].describe(explicit[high_by])}{parts} contradict each"
                    f" other: they leave {name} no value"
                )
            elif high_by:
                message = (
                    f"{high_by}={bounds[high_by].describe(explicit[high_by])}{parts} leave"
                    f" {name} below its minimum {bound.describe(bound.minimum)}"
                )
            else:
                message = (
                    f"{low_by}={bounds[low_by].describe(explicit[low_by])}{parts} need"
                    f" {name} above its ceiling {bound.describe(bound.ceiling)}"
                )
            raise ValueError(message)
        out[name] = min(max(bound.default, low), high)
    return out


def _set_limits(model: BaseModel, values: Mapping[str, float]) -> None:
    """Write resolved defaults into a (frozen) model being validated; they stay "unset"."""
    for name, value in values.items():
        if getattr(model, name) != value:
            object.__setattr__(model, name, type(getattr(model, name))(value))


class _ConfigErrors:
    """Mixin: building the class directly raises ConfigurationError, never pydantic's."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except PydanticValidationError as exc:
            raise ConfigurationError(_describe(exc)) from None

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Self:
        try:
            return super().model_validate(obj, *args, **kwargs)  # type: ignore[misc,no-any-return]
        except PydanticValidationError as exc:
            raise ConfigurationError(_describe(exc)) from None


class ConversationConfig(_ConfigErrors, BaseModel):
    """The ``[conversation]`` section: conversation-memory bounds and persistence."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    BOUNDS: ClassVar[dict[str, limits.Bound]] = limits.configurable("conversation")

    persistence_enabled: bool = False
    storage_path: Path = Path("./memtier-data")
    public_ttl_seconds: float = FROM_BOUND
    im_ttl_seconds: float = FROM_BOUND
    max_active_sessions: int = FROM_BOUND
    max_turns_per_session: int = FROM_BOUND
    max_session_bytes: int = FROM_BOUND
    max_aggregate_bytes: int = FROM_BOUND
    max_tool_results: int = FROM_BOUND
    max_tool_result_bytes: int = FROM_BOUND
    max_summary_bytes: int = FROM_BOUND
    max_snapshot_bytes: int = FROM_BOUND
    max_turn_bytes: int = FROM_BOUND
    max_events: int = FROM_BOUND

    @field_validator(*BOUNDS.keys())
    @classmethod
    def _within_ceiling(cls, value: float, info: ValidationInfo) -> float:
        return _check_bound(value, info, cls.BOUNDS)

    @model_validator(mode="after")
    def _consistent(self) -> ConversationConfig:
        # One partition here; MemtierConfig resolves again with its partitions.
        _set_limits(self, resolve_limits(self.explicit_limits(), self.BOUNDS))
        return self

    def explicit_limits(self) -> dict[str, float]:
        """The bounds that were set (not defaulted), with their values."""
        return {n: getattr(self, n) for n in self.BOUNDS if n in self.model_fields_set}

    @property
    def public_ttl_ms(self) -> int:
        return max(1, round(self.public_ttl_seconds * 1000))

    @property
    def im_ttl_ms(self) -> int:
        return max(1, round(self.im_ttl_seconds * 1000))


_bind_bounds(ConversationConfig, ConversationConfig.BOUNDS)


class ThreadsConfig(_ConfigErrors, BaseModel):
    """The ``[threads]`` section: the frozen limits of the conversation-threads service."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    BOUNDS: ClassVar[dict[str, limits.Bound]] = limits.configurable("threads")

    list_page: int = FROM_BOUND
    replay_page_rows: int = FROM_BOUND
    cursor_bytes: int = FROM_BOUND
    title_bytes: int = FROM_BOUND
    request_id_bytes: int = FROM_BOUND
    max_active_branches: int = FROM_BOUND
    export_bytes: int = FROM_BOUND
    export_pages: int = FROM_BOUND
    request_body_bytes: int = FROM_BOUND
    history_cache_bytes: int = FROM_BOUND
    history_cache_threads: int = FROM_BOUND
    base_path: str = "/memtier/conversations"

    @field_validator(*BOUNDS.keys())
    @classmethod
    def _within_ceiling(cls, value: float, info: ValidationInfo) -> float:
        return _check_bound(value, info, cls.BOUNDS)


_bind_bounds(ThreadsConfig, ThreadsConfig.BOUNDS)


class RedisConfig(BaseModel):
    """The ``[redis]`` section: connection pool, socket deadlines and the retry horizon.

    ``MEMTIER_REDIS__MAX_CONNECTIONS=100`` and so on.  Each has a default and a hard
    ceiling in :mod:`memtier.limits`; configuration may only lower it.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    BOUNDS: ClassVar[dict[str, limits.Bound]] = limits.configurable("redis")

    # "default": an append is acknowledged when the primary ran its script (Redis's own
    # asynchronous replication: a primary lost right after may take the turn with it).
    # "replicated": acknowledged only once `wait_replicas` replicas confirmed it (WAIT,
    # at most `wait_timeout_ms`), else outcome_unknown (retry with the same turn id).
    durability: Literal["default", "replicated"] = "default"
    wait_replicas: int = FROM_BOUND
    wait_timeout_ms: int = FROM_BOUND
    max_connections: int = FROM_BOUND
    pool_timeout_seconds: float = FROM_BOUND
    socket_timeout_seconds: float = FROM_BOUND
    connect_timeout_seconds: float = FROM_BOUND
    retry_horizon_seconds: float = FROM_BOUND
    # asyncio store/service on a standalone server: script calls issued in the same event-loop
    # tick go out in one write on one connection (memtier.autopipeline); False sends each call
    # on its own through redis-py's client.
    auto_pipelining: bool = True
    pipeline_max_calls: int = FROM_BOUND
    pipeline_max_bytes: int = FROM_BOUND

    @field_validator(*BOUNDS.keys())
    @classmethod
    def _within_ceiling(cls, value: float, info: ValidationInfo) -> float:
        return _check_bound(value, info, cls.BOUNDS)


_bind_bounds(RedisConfig, RedisConfig.BOUNDS)


# The TOML data of the from_toml call in progress (a settings source below the
# environment); empty outside one.
_TOML_DATA: ContextVar[dict[str, Any] | None] = ContextVar("memtier_toml_data", default=None)


class _TomlDataSource(PydanticBaseSettingsSource):
    """The TOML file's values, as a settings source ranked below the environment."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return (_TOML_DATA.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_TOML_DATA.get() or {})


class MemtierConfig(_ConfigErrors, BaseSettings):
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
        allow_inf_nan=False,
    )

    redis_url: str | None = None
    namespace: str = Field(default="memtier", pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    partitions: int = Field(default=1, ge=1, le=limits.MAX_PARTITIONS)
    conversation: ConversationConfig = ConversationConfig()
    threads: ThreadsConfig = ThreadsConfig()
    redis: RedisConfig = RedisConfig()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Arguments > environment > TOML file (> .env, secrets: unused) > defaults."""
        return (
            init_settings,
            env_settings,
            _TomlDataSource(settings_cls),
            dotenv_settings,
            file_secret_settings,
        )

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
        explicit = conv.explicit_limits()
        partitions_set = "partitions" in self.model_fields_set
        if conv.max_active_sessions < self.partitions:
            # The default (100000) holds the most partitions (1024): both were set.
            raise ValueError(
                f"partitions={self.partitions} and max_active_sessions="
                f"{conv.max_active_sessions} contradict each other: every partition needs"
                " at least one session (max_active_sessions >= partitions)"
            )
        resolved = resolve_limits(explicit, conv.BOUNDS, self.partitions, partitions_set)
        if any(getattr(conv, n) != v for n, v in resolved.items()):
            conv = conv.model_copy()  # keeps which fields were set
            _set_limits(conv, resolved)
            object.__setattr__(self, "conversation", conv)
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
        """Load a TOML file (top-level keys plus ``[conversation]``, ``[threads]``, ``[redis]``).

        The file ranks below ``MEMTIER_*`` environment variables, which rank below
        ``overrides`` (see the module docstring).
        """
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigurationError(f"cannot read config file {path}: {exc}") from exc
        token = _TOML_DATA.set(data)
        try:
            return cls.load(**overrides)
        finally:
            _TOML_DATA.reset(token)


_PREFIX: Final = "invalid configuration: "


def _describe(exc: PydanticValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"])
        nested = (err.get("ctx") or {}).get("error")
        if isinstance(nested, ConfigurationError):  # a section's own error, raised inside
            msg = nested.message.removeprefix(_PREFIX)
        else:
            msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return _PREFIX + "; ".join(parts)


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
